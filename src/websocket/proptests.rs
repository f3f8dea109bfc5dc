//! Properties: the reader reports exactly the messages and control frames written, however the
//! bytes are cut into feeds; and on any bytes at all, cut reading equals one-piece reading.

use proptest::prelude::*;

use super::encode::{write_frame, Deflater, FrameSpec};
use super::{
    read_all, Collected, CollectedEvents, DeflateParams, Direction, FrameReader, Limits,
    MessageKind, Opcode,
};

/// One thing a sender writes.
#[derive(Debug, Clone)]
enum Item {
    /// A data message, cut into fragments at these payload offsets, pings after some fragments.
    Message {
        binary: bool,
        payload: Vec<u8>,
        cuts: Vec<usize>,
        compress: bool,
        pings_after: Vec<usize>,
    },
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

/// A whole direction: how it was negotiated and what it carries.
#[derive(Debug, Clone)]
struct Script {
    client: bool,
    deflate: Option<bool>,
    max_message_bytes: usize,
    items: Vec<Item>,
    close: Option<(u16, String)>,
    key: [u8; 4],
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..200),
        // Text that compresses, sometimes long enough for 16-bit lengths and the bounds.
        2 => ("[a-z \"{}:,]{0,40}", 1..60usize).prop_map(|(s, n)| s.repeat(n).into_bytes()),
    ]
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        6 => (
            any::<bool>(),
            payload(),
            proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
            any::<bool>(),
            proptest::collection::vec(0..4usize, 0..2),
        )
            .prop_map(|(binary, payload, cuts, compress, pings_after)| {
                let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(payload.len() + 1)).collect();
                cuts.sort_unstable();
                Item::Message { binary, payload, cuts, compress, pings_after }
            }),
        1 => proptest::collection::vec(any::<u8>(), 0..=125).prop_map(Item::Ping),
        1 => proptest::collection::vec(any::<u8>(), 0..=125).prop_map(Item::Pong),
    ]
}

fn script() -> impl Strategy<Value = Script> {
    (
        any::<bool>(),
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
        prop_oneof![Just(1usize), Just(7), Just(64), Just(1000), Just(64 * 1024)],
        proptest::collection::vec(item(), 0..12),
        proptest::option::of((
            prop_oneof![Just(1000u16), Just(1001), Just(4000)],
            "[a-z ✓]{0,20}",
        )),
        any::<[u8; 4]>(),
    )
        .prop_map(
            |(client, deflate, max_message_bytes, items, close, key)| Script {
                client,
                deflate,
                max_message_bytes,
                items,
                close,
                key,
            },
        )
}

// === impl Script ===

impl Script {
    fn direction(&self) -> Direction {
        if self.client {
            Direction::ClientToServer
        } else {
            Direction::ServerToClient
        }
    }

    fn params(&self) -> Option<DeflateParams> {
        self.deflate.map(|takeover| DeflateParams {
            server_no_context_takeover: !takeover,
            client_no_context_takeover: !takeover,
            ..DeflateParams::default()
        })
    }

    fn limits(&self) -> Limits {
        Limits {
            max_message_bytes: self.max_message_bytes,
            ..Limits::default()
        }
    }

    /// The bytes on the wire and what a reader must report of them.
    fn write(&self) -> (Vec<u8>, Vec<Collected>) {
        let mut out = Vec::new();
        let mut expected = Vec::new();
        let mut deflater = self.deflate.map(Deflater::new);
        let mask = self.client.then_some(self.key);
        let spec = |opcode, fin, rsv1| FrameSpec {
            opcode,
            fin,
            rsv1,
            mask,
        };
        for item in &self.items {
            match item {
                Item::Ping(data) => {
                    write_frame(&mut out, spec(Opcode::Ping, true, false), data);
                    expected.push(Collected::Ping(data.clone()));
                }
                Item::Pong(data) => {
                    write_frame(&mut out, spec(Opcode::Pong, true, false), data);
                    expected.push(Collected::Pong(data.clone()));
                }
                Item::Message {
                    binary,
                    payload,
                    cuts,
                    compress,
                    pings_after,
                } => {
                    let start = out.len() as u64;
                    let compressed = match (&mut deflater, compress) {
                        (Some(d), true) => Some(d.compress(payload)),
                        _ => None,
                    };
                    let wire = compressed.as_deref().unwrap_or(payload);
                    let mut bounds: Vec<usize> = cuts
                        .iter()
                        .map(|c| c * wire.len() / payload.len().max(1))
                        .collect();
                    bounds.insert(0, 0);
                    bounds.push(wire.len());
                    let frames = bounds.len() - 1;
                    for i in 0..frames {
                        let opcode = match (i, binary) {
                            (0, true) => Opcode::Binary,
                            (0, false) => Opcode::Text,
                            _ => Opcode::Continuation,
                        };
                        let last = i + 1 == frames;
                        let rsv1 = i == 0 && compressed.is_some();
                        write_frame(
                            &mut out,
                            spec(opcode, last, rsv1),
                            &wire[bounds[i]..bounds[i + 1]],
                        );
                        if !last && pings_after.contains(&i) {
                            write_frame(&mut out, spec(Opcode::Ping, true, false), b"between");
                            expected.push(Collected::Ping(b"between".to_vec()));
                        }
                    }
                    let kept = payload.len().min(self.max_message_bytes);
                    expected.push(Collected::Message {
                        kind: if *binary {
                            MessageKind::Binary
                        } else {
                            MessageKind::Text
                        },
                        data: payload[..kept].to_vec(),
                        oversize: payload.len() > self.max_message_bytes,
                        compressed: compressed.is_some(),
                        frames: frames as u32,
                        wire_len: wire.len() as u64,
                        start,
                        end: out.len() as u64,
                    });
                }
            }
        }
        if let Some((code, reason)) = &self.close {
            let mut data = code.to_be_bytes().to_vec();
            data.extend_from_slice(reason.as_bytes());
            write_frame(&mut out, spec(Opcode::Close, true, false), &data);
            expected.push(Collected::Close(Some((*code, reason.clone()))));
        }
        (out, expected)
    }
}

/// Feeds `bytes` cut at `cuts` (offsets, any order) to a fresh reader.
fn read_cut(script: &Script, bytes: &[u8], cuts: &[prop::sample::Index]) -> CollectedEvents {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    let mut reader = FrameReader::new(script.direction(), script.params(), script.limits());
    let mut sink = CollectedEvents::default();
    for pair in at.windows(2) {
        reader.feed(&bytes[pair[0]..pair[1]], &mut sink);
    }
    assert_eq!(reader.offset(), bytes.len() as u64);
    sink
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_reader_reports_exactly_what_was_written(script in script()) {
        let (bytes, expected) = script.write();
        let read = read_all(script.direction(), script.params(), script.limits(), &bytes);
        prop_assert_eq!(read.events, expected);
    }

    #[test]
    fn however_the_bytes_are_cut_the_reader_reports_what_one_piece_gives(
        script in script(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let (bytes, _) = script.write();
        let whole = read_all(script.direction(), script.params(), script.limits(), &bytes);
        prop_assert_eq!(read_cut(&script, &bytes, &cuts), whole);
    }

    #[test]
    fn damaged_bytes_cut_anywhere_read_as_in_one_piece_within_the_bound(
        script in script(),
        damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let (mut bytes, _) = script.write();
        if bytes.is_empty() {
            bytes.push(0);
        }
        for (at, value) in &damage {
            let at = at.index(bytes.len());
            bytes[at] = *value;
        }
        let whole = read_all(script.direction(), script.params(), script.limits(), &bytes);
        prop_assert_eq!(read_cut(&script, &bytes, &cuts), whole.clone());
        for event in &whole.events {
            if let Collected::Message { data, .. } = event {
                prop_assert!(data.len() <= script.max_message_bytes);
            }
        }
    }
}
