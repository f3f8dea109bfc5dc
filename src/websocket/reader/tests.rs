use super::super::encode::{write_frame, Deflater, FrameSpec};
use super::super::{read_all, Collected, CollectedEvents};
use super::*;

const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

fn server(bytes: &[u8]) -> Vec<Collected> {
    read_all(Direction::ServerToClient, None, Limits::default(), bytes).events
}

fn client(bytes: &[u8]) -> Vec<Collected> {
    read_all(Direction::ClientToServer, None, Limits::default(), bytes).events
}

fn text(data: &[u8], frames: u32, wire_len: u64, start: u64, end: u64) -> Collected {
    Collected::Message {
        kind: MessageKind::Text,
        data: data.to_vec(),
        oversize: false,
        compressed: false,
        frames,
        wire_len,
        start,
        end,
    }
}

fn spec(opcode: Opcode, fin: bool) -> FrameSpec {
    FrameSpec {
        opcode,
        fin,
        rsv1: false,
        mask: None,
    }
}

fn frame(spec: FrameSpec, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, spec, payload);
    out
}

/// Records where each message's data lay, to tell a borrowed slice from the reader's buffer.
#[derive(Default)]
struct Addresses(Vec<(usize, usize)>);

impl MessageSink for Addresses {
    fn on_message(&mut self, message: Message<'_>) {
        let start = message.data.as_ptr() as usize;
        self.0.push((start, start + message.data.len()));
    }
}

fn lies_in(range: (usize, usize), bytes: &[u8]) -> bool {
    let start = bytes.as_ptr() as usize;
    range.0 >= start && range.1 <= start + bytes.len()
}

// RFC 6455 §5.7 examples.

#[test]
fn a_single_frame_unmasked_text_message_reads_hello() {
    let bytes = [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
    assert_eq!(server(&bytes), [text(b"Hello", 1, 5, 0, 7)]);
}

#[test]
fn a_single_frame_masked_text_message_reads_hello() {
    let bytes = [
        0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(client(&bytes), [text(b"Hello", 1, 5, 0, 11)]);
}

#[test]
fn a_fragmented_unmasked_text_message_reads_hello_once() {
    let bytes = [0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f];
    assert_eq!(server(&bytes), [text(b"Hello", 2, 5, 0, 9)]);
}

#[test]
fn an_unmasked_ping_and_a_masked_pong_carry_hello() {
    let ping = [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
    assert_eq!(server(&ping), [Collected::Ping(b"Hello".to_vec())]);
    let pong = [
        0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(client(&pong), [Collected::Pong(b"Hello".to_vec())]);
}

#[test]
fn a_256_byte_binary_message_has_a_16_bit_length() {
    let payload: Vec<u8> = (0..=255).collect();
    let mut bytes = vec![0x82, 0x7e, 0x01, 0x00];
    bytes.extend_from_slice(&payload);
    let events = server(&bytes);
    assert_eq!(
        events,
        [Collected::Message {
            kind: MessageKind::Binary,
            data: payload,
            oversize: false,
            compressed: false,
            frames: 1,
            wire_len: 256,
            start: 0,
            end: 260,
        }]
    );
}

#[test]
fn a_64_kib_binary_message_has_a_64_bit_length_and_is_oversize_past_the_bound() {
    let payload: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let mut bytes = vec![0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0];
    bytes.extend_from_slice(&payload);
    let roomy = Limits {
        max_message_bytes: 1 << 20,
        ..Limits::default()
    };
    let whole = read_all(Direction::ServerToClient, None, roomy, &bytes);
    assert!(
        matches!(&whole.events[..], [Collected::Message { data, oversize: false, end: 65546, .. }] if *data == payload)
    );
    let tight = Limits {
        max_message_bytes: 1000,
        ..Limits::default()
    };
    let cut = read_all(Direction::ServerToClient, None, tight, &bytes);
    assert!(
        matches!(&cut.events[..], [Collected::Message { data, oversize: true, wire_len: 65536, .. }] if data[..] == payload[..1000])
    );
}

// Zero copy, positions, bounds.

#[test]
fn a_whole_unmasked_message_in_one_feed_is_a_slice_of_the_fed_bytes() {
    let bytes = [
        frame(spec(Opcode::Text, true), b"Hello"),
        frame(spec(Opcode::Binary, true), b"abc"),
    ]
    .concat();
    let mut sink = Addresses::default();
    FrameReader::new(Direction::ServerToClient, None, Limits::default()).feed(&bytes, &mut sink);
    assert_eq!(sink.0.len(), 2);
    assert!(sink.0.iter().all(|&r| lies_in(r, &bytes)));
    // A masked one cannot be: it is unmasked into the reader's buffer.
    let masked = frame(
        FrameSpec {
            mask: Some(KEY),
            ..spec(Opcode::Text, true)
        },
        b"Hello",
    );
    let mut sink = Addresses::default();
    FrameReader::new(Direction::ClientToServer, None, Limits::default()).feed(&masked, &mut sink);
    assert!(!lies_in(sink.0[0], &masked));
}

/// Counts what each feed completed.
#[derive(Default)]
struct PerFeed {
    ends: Vec<u64>,
}

impl MessageSink for PerFeed {
    fn on_message(&mut self, message: Message<'_>) {
        self.ends.push(message.end);
    }
}

#[test]
fn a_message_is_reported_by_the_feed_that_carries_its_last_byte() {
    let bytes = [
        frame(spec(Opcode::Text, true), b"one"),
        frame(spec(Opcode::Text, true), b"two"),
        frame(spec(Opcode::Text, true), b"three"),
    ]
    .concat();
    let mut reader = FrameReader::new(Direction::ServerToClient, None, Limits::default());
    // Feeds: [0, 4) ends nothing, [4, 11) ends "one" (5) and "two" (10), the rest ends "three".
    let mut per_feed = Vec::new();
    for range in [0..4, 4..11, 11..bytes.len()] {
        let mut sink = PerFeed::default();
        let before = reader.offset();
        reader.feed(&bytes[range.clone()], &mut sink);
        assert!(sink
            .ends
            .iter()
            .all(|&e| e > before && e <= reader.offset()));
        per_feed.push(sink.ends);
    }
    assert_eq!(per_feed, [vec![], vec![5, 10], vec![17]]);
}

#[test]
fn a_header_split_across_feeds_is_carried_and_the_stream_keeps_its_offsets() {
    let bytes = [
        frame(spec(Opcode::Text, true), &[b'x'; 300]),
        frame(spec(Opcode::Text, true), b"Hello"),
    ]
    .concat();
    let whole = server(&bytes);
    for cut in 1..bytes.len() {
        let mut sink = CollectedEvents::default();
        let mut reader = FrameReader::new(Direction::ServerToClient, None, Limits::default());
        reader.feed(&bytes[..cut], &mut sink);
        reader.feed(&bytes[cut..], &mut sink);
        assert_eq!(sink.events, whole, "cut at {cut}");
    }
    assert!(matches!(
        whole[1],
        Collected::Message {
            start: 304,
            end: 311,
            ..
        }
    ));
}

#[test]
fn a_control_frame_between_fragments_is_reported_and_the_message_goes_on() {
    let bytes = [
        frame(spec(Opcode::Text, false), b"Hel"),
        frame(spec(Opcode::Ping, true), b"are you there"),
        frame(spec(Opcode::Continuation, true), b"lo"),
    ]
    .concat();
    assert_eq!(
        server(&bytes),
        [
            Collected::Ping(b"are you there".to_vec()),
            text(b"Hello", 2, 5, 0, bytes.len() as u64)
        ]
    );
}

#[test]
fn an_empty_last_fragment_ends_the_message_with_what_came_before() {
    let bytes = [
        frame(spec(Opcode::Text, false), b"Hello"),
        frame(spec(Opcode::Continuation, true), b""),
    ]
    .concat();
    assert_eq!(server(&bytes), [text(b"Hello", 2, 5, 0, 9)]);
}

#[test]
fn an_oversize_message_keeps_its_beginning_and_the_next_one_reads_whole() {
    let limits = Limits {
        max_message_bytes: 3,
        ..Limits::default()
    };
    let bytes = [
        frame(spec(Opcode::Text, false), b"He"),
        frame(spec(Opcode::Continuation, true), b"llo"),
        frame(spec(Opcode::Text, true), b"Hi"),
    ]
    .concat();
    let events = read_all(Direction::ServerToClient, None, limits, &bytes).events;
    assert!(
        matches!(&events[0], Collected::Message { data, oversize: true, wire_len: 5, .. } if data == b"Hel")
    );
    assert_eq!(events[1], text(b"Hi", 1, 2, 9, 13));
}

#[test]
fn a_close_frame_gives_its_code_and_reason_and_nothing_may_follow() {
    let mut payload = 4000u16.to_be_bytes().to_vec();
    payload.extend_from_slice("bye ✓".as_bytes());
    let close = frame(spec(Opcode::Close, true), &payload);
    assert_eq!(
        server(&close),
        [Collected::Close(Some((4000, "bye ✓".into())))]
    );
    let empty = frame(spec(Opcode::Close, true), b"");
    assert_eq!(server(&empty), [Collected::Close(None)]);
    let after = [close.clone(), frame(spec(Opcode::Text, true), b"late")].concat();
    assert_eq!(
        server(&after)[1],
        Collected::Stopped(ReadError::DataAfterClose, close.len() as u64)
    );
}

#[test]
fn a_close_frame_that_breaks_the_rules_stops_the_reading() {
    let cases: [(&[u8], ReadError); 4] = [
        (&[0x03], ReadError::CloseTooShort),
        (&[0x03, 0xed], ReadError::InvalidCloseCode(1005)),
        (&[0x07, 0xd0], ReadError::InvalidCloseCode(2000)),
        (&[0x03, 0xe8, 0xff], ReadError::CloseReasonNotUtf8),
    ];
    for (payload, error) in cases {
        let bytes = frame(spec(Opcode::Close, true), payload);
        assert_eq!(
            server(&bytes),
            [Collected::Stopped(error, 0)],
            "{payload:?}"
        );
    }
}

#[test]
fn frames_out_of_sequence_stop_the_reading_at_the_offending_frame() {
    let hello = frame(spec(Opcode::Text, true), b"Hello");
    let stray = [hello.clone(), frame(spec(Opcode::Continuation, true), b"x")].concat();
    assert_eq!(
        server(&stray)[1],
        Collected::Stopped(ReadError::UnexpectedContinuation, hello.len() as u64)
    );
    let open = frame(spec(Opcode::Text, false), b"Hel");
    let interrupted = [open.clone(), hello.clone()].concat();
    assert_eq!(
        server(&interrupted),
        [Collected::Stopped(
            ReadError::MessageInterrupted,
            open.len() as u64
        )]
    );
}

#[test]
fn after_an_error_nothing_more_is_reported_and_the_buffers_are_given_back() {
    let mut reader = FrameReader::new(Direction::ServerToClient, None, Limits::default());
    let mut sink = CollectedEvents::default();
    reader.feed(&frame(spec(Opcode::Text, false), &[b'x'; 5000]), &mut sink);
    assert!(reader.buf.capacity() >= 5000);
    reader.feed(&[0x83, 0x00], &mut sink);
    reader.feed(&frame(spec(Opcode::Text, true), b"Hello"), &mut sink);
    assert_eq!(
        sink.events,
        [Collected::Stopped(ReadError::ReservedOpcode(3), 5004)]
    );
    assert_eq!(reader.stopped(), Some(ReadError::ReservedOpcode(3)));
    assert_eq!(reader.buf.capacity(), 0);
    assert_eq!(reader.offset(), 5004 + 2 + 7);
}

#[test]
fn a_long_message_buffer_is_given_back_once_the_message_is_done() {
    let mut reader = FrameReader::new(Direction::ServerToClient, None, Limits::default());
    let bytes = [
        frame(spec(Opcode::Text, false), &[b'x'; 5000]),
        frame(spec(Opcode::Continuation, true), b"!"),
    ]
    .concat();
    reader.feed(&bytes, &mut CollectedEvents::default());
    assert_eq!(reader.buf.capacity(), 0);
}

#[test]
fn a_reader_is_small_while_idle() {
    // Pinned so that idle tunnels stay cheap (two readers each): 280 bytes, of which 125 are
    // the inline control payload; the buffers and the inflater are allocated only when used.
    assert!(
        std::mem::size_of::<FrameReader>() <= 288,
        "{}",
        std::mem::size_of::<FrameReader>()
    );
}

// permessage-deflate: RFC 7692 §7.2.3 examples, as frames.

fn deflate_reader(direction: Direction, takeover: bool) -> FrameReader {
    let params = DeflateParams {
        server_no_context_takeover: !takeover,
        client_no_context_takeover: !takeover,
        ..DeflateParams::default()
    };
    FrameReader::new(direction, Some(params), Limits::default())
}

fn compressed_text(data: &[u8], frames: u32, wire_len: u64, start: u64, end: u64) -> Collected {
    Collected::Message {
        kind: MessageKind::Text,
        data: data.to_vec(),
        oversize: false,
        compressed: true,
        frames,
        wire_len,
        start,
        end,
    }
}

/// RFC 7692 §7.2.3.1: "Hello" compressed in one frame.
const HELLO_FRAME: [u8; 9] = [0xc1, 0x07, 0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];

/// Feeds `feeds` one by one to a server reader with permessage-deflate.
fn read_deflated(takeover: bool, feeds: &[&[u8]]) -> Vec<Collected> {
    let mut sink = CollectedEvents::default();
    let mut reader = deflate_reader(Direction::ServerToClient, takeover);
    for bytes in feeds {
        reader.feed(bytes, &mut sink);
    }
    sink.events
}

#[test]
fn a_compressed_hello_in_one_frame_and_in_two_reads_hello() {
    let two = [
        0x41, 0x03, 0xf2, 0x48, 0xcd, 0x80, 0x04, 0xc9, 0xc9, 0x07, 0x00,
    ];
    assert_eq!(
        read_deflated(true, &[&HELLO_FRAME, &two]),
        [
            compressed_text(b"Hello", 1, 7, 0, 9),
            compressed_text(b"Hello", 2, 7, 9, 20)
        ]
    );
}

#[test]
fn two_compressed_hellos_share_the_window_with_context_takeover() {
    // RFC 7692 §7.2.3.2: the second message is one back-reference into the first.
    let second = [0xc1, 0x05, 0xf2, 0x00, 0x11, 0x00, 0x00];
    assert_eq!(
        read_deflated(true, &[&[&HELLO_FRAME[..], &second[..]].concat()]),
        [
            compressed_text(b"Hello", 1, 7, 0, 9),
            compressed_text(b"Hello", 1, 5, 9, 16)
        ]
    );
}

#[test]
fn without_context_takeover_each_compressed_message_stands_alone() {
    // The back-reference of §7.2.3.2 finds nothing before its message: a DEFLATE error.
    let second = [0xc1, 0x05, 0xf2, 0x00, 0x11, 0x00, 0x00];
    assert_eq!(
        read_deflated(false, &[&HELLO_FRAME, &HELLO_FRAME, &second]),
        [
            compressed_text(b"Hello", 1, 7, 0, 9),
            compressed_text(b"Hello", 1, 7, 9, 18),
            Collected::Stopped(ReadError::InvalidDeflate, 18)
        ]
    );
}

#[test]
fn the_no_compression_bfinal_and_two_block_examples_read_hello() {
    let payloads: [&[u8]; 3] = [
        &[
            0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
        ],
        &[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00],
        &[
            0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00,
        ],
    ];
    for payload in payloads {
        let compressed = FrameSpec {
            rsv1: true,
            ..spec(Opcode::Text, true)
        };
        let bytes = [
            frame(compressed, payload),
            frame(compressed, &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]),
        ]
        .concat();
        let events = read_all(
            Direction::ServerToClient,
            Some(DeflateParams::default()),
            Limits::default(),
            &bytes,
        )
        .events;
        let datas: Vec<_> = events
            .iter()
            .map(|e| match e {
                Collected::Message { data, .. } => data.as_slice(),
                _ => b"?",
            })
            .collect();
        assert_eq!(datas, [b"Hello", b"Hello"], "{payload:02x?}");
    }
}

#[test]
fn a_masked_compressed_fragmented_message_reads_whole_with_a_ping_between() {
    let text_data = "the quick brown fox jumps over the lazy dog ".repeat(80);
    let payload = Deflater::new(true).compress(text_data.as_bytes());
    let (a, b) = payload.split_at(payload.len() / 3);
    let masked = |opcode, fin, rsv1| FrameSpec {
        opcode,
        fin,
        rsv1,
        mask: Some(KEY),
    };
    let bytes = [
        frame(masked(Opcode::Text, false, true), a),
        frame(masked(Opcode::Ping, true, false), b"p"),
        frame(masked(Opcode::Continuation, true, false), b),
    ]
    .concat();
    let mut reader = deflate_reader(Direction::ClientToServer, true);
    let mut sink = CollectedEvents::default();
    for piece in bytes.chunks(7) {
        reader.feed(piece, &mut sink);
    }
    assert_eq!(sink.events[0], Collected::Ping(b"p".to_vec()));
    assert!(
        matches!(&sink.events[1], Collected::Message { data, compressed: true, frames: 2, oversize: false, .. } if data == text_data.as_bytes())
    );
}

#[test]
fn a_compressed_message_past_the_bound_is_oversize_and_the_next_still_inflates() {
    for takeover in [true, false] {
        let mut deflater = Deflater::new(takeover);
        let long = "a long message that does not fit ".repeat(100);
        let compressed = FrameSpec {
            rsv1: true,
            ..spec(Opcode::Text, true)
        };
        let bytes = [
            frame(compressed, &deflater.compress(long.as_bytes())),
            frame(compressed, &deflater.compress(long.as_bytes())),
            frame(compressed, &deflater.compress(b"short")),
        ]
        .concat();
        let limits = Limits {
            max_message_bytes: 100,
            ..Limits::default()
        };
        let params = DeflateParams {
            server_no_context_takeover: !takeover,
            ..DeflateParams::default()
        };
        let events = read_all(Direction::ServerToClient, Some(params), limits, &bytes).events;
        assert!(
            matches!(&events[0], Collected::Message { data, oversize: true, .. } if data[..] == long.as_bytes()[..100])
        );
        assert!(matches!(
            &events[1],
            Collected::Message { oversize: true, .. }
        ));
        assert!(
            matches!(&events[2], Collected::Message { data, oversize: false, .. } if data == b"short"),
            "takeover {takeover}: {:?}",
            events[2]
        );
    }
}

#[test]
fn compressed_frames_without_the_extension_are_refused() {
    assert_eq!(
        server(&HELLO_FRAME),
        [Collected::Stopped(ReadError::ReservedBits(0b100), 0)]
    );
}

#[test]
fn an_unsupported_extension_gets_no_reader() {
    let limits = Limits::default();
    assert!(FrameReader::for_extensions(
        Direction::ServerToClient,
        &Extensions::Unsupported,
        limits
    )
    .is_none());
    assert!(
        FrameReader::for_extensions(Direction::ServerToClient, &Extensions::None, limits).is_some()
    );
}

#[test]
fn a_frame_boundary_is_between_frames_only() {
    let bytes = frame(spec(Opcode::Text, true), b"hello");
    let mut reader = FrameReader::new(Direction::ServerToClient, None, Limits::default());
    let mut sink = CollectedEvents::default();
    assert!(reader.at_frame_boundary());
    reader.feed(&bytes[..1], &mut sink);
    assert!(!reader.at_frame_boundary(), "inside a header");
    reader.feed(&bytes[1..4], &mut sink);
    assert!(!reader.at_frame_boundary(), "inside a payload");
    reader.feed(&bytes[4..], &mut sink);
    assert!(reader.at_frame_boundary());
    // A masked frame toward a client is a protocol error: the reading stops, and no boundary
    // is known any more.
    let masked = frame(
        FrameSpec {
            mask: Some(KEY),
            ..spec(Opcode::Text, true)
        },
        b"x",
    );
    reader.feed(&masked, &mut sink);
    assert!(reader.stopped().is_some());
    assert!(!reader.at_frame_boundary());
}
