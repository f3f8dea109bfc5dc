//! The reader against frames written by another implementation: Python's `websockets` library,
//! in tests/fixtures/websocket/ (scripts/gen-websocket-fixtures.py says how they were made).
//! Each direction of each recorded session is read whole, byte by byte and in uneven pieces,
//! with a bound that keeps every message whole and with the default one.

use std::path::PathBuf;

use serde_json::Value;

use super::{Collected, CollectedEvents, Direction, Extensions, FrameReader, Limits, MessageKind};

const SCENARIOS: [&str; 3] = ["plain", "deflate", "deflate_no_takeover"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/websocket")
        .join(name)
}

/// FNV-1a, 64 bits: the generator's digest of a message too long to keep inline.
fn fnv1a64(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks one reported event against the generator's record of what was sent.
fn check(got: &Collected, sent: &Value, max: usize, at: &str) {
    if let Some(ping) = sent.get("ping_hex") {
        assert_eq!(got, &Collected::Ping(unhex(ping)), "{at}");
    } else if let Some(pong) = sent.get("pong_hex") {
        assert_eq!(got, &Collected::Pong(unhex(pong)), "{at}");
    } else if let Some(close) = sent.get("close") {
        let code = close[0].as_u64().unwrap() as u16;
        let reason = close[1].as_str().unwrap().to_string();
        assert_eq!(got, &Collected::Close(Some((code, reason))), "{at}");
    } else {
        let Collected::Message {
            kind,
            data,
            oversize,
            compressed,
            frames,
            ..
        } = got
        else {
            panic!("{at}: {got:?} where a message was sent: {sent}");
        };
        let len = sent["len"].as_u64().unwrap() as usize;
        let want_kind = match sent["kind"].as_str() {
            Some("text") => MessageKind::Text,
            _ => MessageKind::Binary,
        };
        assert_eq!(*kind, want_kind, "{at}");
        assert_eq!(u64::from(*frames), sent["frames"].as_u64().unwrap(), "{at}");
        assert_eq!(*compressed, sent["compressed"].as_bool().unwrap(), "{at}");
        assert_eq!(*oversize, len > max, "{at}");
        assert_eq!(data.len(), len.min(max), "{at}");
        if len <= max {
            assert_eq!(fnv1a64(data), sent["fnv1a64"].as_str().unwrap(), "{at}");
        }
        if let Some(inline) = sent.get("data_hex") {
            assert_eq!(hex(data), inline.as_str().unwrap(), "{at}");
        }
        if let Some(head) = sent.get("head_hex") {
            assert_eq!(hex(&data[..32]), head.as_str().unwrap(), "{at}");
        }
    }
}

fn unhex(value: &Value) -> Vec<u8> {
    let text = value.as_str().unwrap().as_bytes();
    text.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

#[test]
fn frames_written_by_pythons_websockets_read_as_they_were_sent() {
    for scenario in SCENARIOS {
        let manifest: Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(&format!("{scenario}.json"))).unwrap(),
        )
        .unwrap();
        let header = manifest["extensions"].as_str().unwrap();
        let fields: Vec<&[u8]> = if header.is_empty() {
            vec![]
        } else {
            vec![header.as_bytes()]
        };
        let extensions = Extensions::from_response(fields).unwrap();
        assert_eq!(
            matches!(extensions, Extensions::PerMessageDeflate(_)),
            scenario != "plain"
        );
        for (direction, ext, key) in [
            (Direction::ClientToServer, "c2s", "client_to_server"),
            (Direction::ServerToClient, "s2c", "server_to_client"),
        ] {
            let bytes = std::fs::read(fixture(&format!("{scenario}.{ext}"))).unwrap();
            let sent = manifest[key].as_array().unwrap();
            for max in [1 << 20, Limits::default().max_message_bytes] {
                let limits = Limits {
                    max_message_bytes: max,
                    ..Limits::default()
                };
                for piece in [bytes.len(), 1, 7, 1000] {
                    let mut reader =
                        FrameReader::for_extensions(direction, &extensions, limits).unwrap();
                    let mut sink = CollectedEvents::default();
                    for chunk in bytes.chunks(piece) {
                        reader.feed(chunk, &mut sink);
                    }
                    let at = format!("{scenario}.{ext}, bound {max}, pieces of {piece}");
                    assert_eq!(sink.events.len(), sent.len(), "{at}: {:?}", sink.events);
                    for (i, (got, sent)) in sink.events.iter().zip(sent).enumerate() {
                        check(got, sent, max, &format!("{at}, event {i}"));
                    }
                    assert!(reader.is_closed(), "{at}");
                    assert_eq!(reader.offset(), bytes.len() as u64);
                }
            }
        }
    }
}
