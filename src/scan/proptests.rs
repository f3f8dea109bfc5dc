//! Property: however a stream is cut into frames, the incremental scan reports exactly the events
//! of a one-shot parse of the whole stream.

use proptest::prelude::*;

use super::{scan_all, CollectedEvents, Framing, Scanner};

fn line_end() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("\n"), Just("\r"), Just("\r\n")]
}

/// Field values: ASCII, JSON-ish punctuation and multi-byte UTF-8, never a line end.
fn value() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[a-z0-9 :{}\",\\[\\]éü漢字🙂]{0,40}").unwrap()
}

#[derive(Debug, Clone)]
enum Line {
    Data(String),
    DataNoSpace(String),
    Event(String),
    Comment(String),
    Id(String),
    Blank,
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        4 => value().prop_map(Line::Data),
        2 => value().prop_map(Line::DataNoSpace),
        1 => "[a-z_]{1,12}".prop_map(Line::Event),
        1 => value().prop_map(Line::Comment),
        1 => "[0-9]{1,4}".prop_map(Line::Id),
        3 => Just(Line::Blank),
    ]
}

fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        proptest::collection::vec((line(), line_end()), 0..60),
    )
        .prop_map(|(bom, lines)| {
            let mut out = Vec::new();
            if bom {
                out.extend_from_slice("\u{feff}".as_bytes());
            }
            for (line, end) in lines {
                match line {
                    Line::Data(v) => out.extend_from_slice(format!("data: {v}").as_bytes()),
                    Line::DataNoSpace(v) => out.extend_from_slice(format!("data:{v}").as_bytes()),
                    Line::Event(v) => out.extend_from_slice(format!("event: {v}").as_bytes()),
                    Line::Comment(v) => out.extend_from_slice(format!(":{v}").as_bytes()),
                    Line::Id(v) => out.extend_from_slice(format!("id: {v}").as_bytes()),
                    Line::Blank => {}
                }
                out.extend_from_slice(end.as_bytes());
            }
            out
        })
}

fn ndjson_stream() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec((value(), prop_oneof![Just("\n"), Just("\r\n")]), 0..40).prop_map(
        |lines| {
            let mut out = Vec::new();
            for (v, end) in lines {
                out.extend_from_slice(format!("{{\"v\":\"{v}\"}}{end}").as_bytes());
            }
            out
        },
    )
}

/// Cuts `body` at the given (sorted, deduplicated) offsets.
fn frames(body: &[u8], mut cuts: Vec<usize>) -> Vec<&[u8]> {
    cuts.retain(|c| *c < body.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in cuts {
        out.push(&body[start..cut]);
        start = cut;
    }
    out.push(&body[start..]);
    out
}

fn scan_frames(framing: Framing, frames: &[&[u8]], max: usize) -> CollectedEvents {
    let mut sink = CollectedEvents::default();
    let mut scanner = Scanner::new(framing, max);
    for frame in frames {
        scanner.feed(frame, &mut sink);
    }
    scanner.finish(&mut sink);
    sink
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sse_events_do_not_depend_on_framing(
        body in sse_stream(),
        cuts in proptest::collection::vec(0usize..4000, 0..40),
        max in prop_oneof![Just(16usize), Just(64), Just(65536)],
    ) {
        let whole = scan_all(Framing::Sse, &body, max);
        let cut = scan_frames(Framing::Sse, &frames(&body, cuts), max);
        prop_assert_eq!(&cut, &whole);
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        prop_assert_eq!(&scan_frames(Framing::Sse, &bytewise, max), &whole);
    }

    #[test]
    fn ndjson_events_do_not_depend_on_framing(
        body in ndjson_stream(),
        cuts in proptest::collection::vec(0usize..3000, 0..40),
        max in prop_oneof![Just(16usize), Just(65536)],
    ) {
        let whole = scan_all(Framing::Ndjson, &body, max);
        prop_assert_eq!(&scan_frames(Framing::Ndjson, &frames(&body, cuts), max), &whole);
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        prop_assert_eq!(&scan_frames(Framing::Ndjson, &bytewise, max), &whole);
    }

    #[test]
    fn single_style_sse_matches_a_simple_model(
        events in proptest::collection::vec(proptest::collection::vec(value(), 1..4), 0..20),
        end in line_end(),
        cuts in proptest::collection::vec(0usize..3000, 0..30),
    ) {
        // With one line-end style and no blank-line ambiguity, the events are exactly the data.
        let mut body = Vec::new();
        for lines in &events {
            for l in lines {
                body.extend_from_slice(format!("data: {l}{end}").as_bytes());
            }
            body.extend_from_slice(end.as_bytes());
        }
        let got = scan_frames(Framing::Sse, &frames(&body, cuts), 1 << 20);
        let expected: Vec<Vec<u8>> = events.iter().map(|lines| lines.join("\n").into_bytes()).collect();
        let data: Vec<Vec<u8>> = got.events.into_iter().map(|e| e.1).collect();
        prop_assert_eq!(data, expected);
    }
}
