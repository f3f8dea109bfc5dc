//! Property: through the real proxy, for generated event streams cut at random offsets into random
//! frames, the client receives exactly the upstream's bytes, and the proxy counts exactly the
//! events and token events that a one-shot parse of the whole stream finds. The same holds for
//! the recorded stream of every supported API (tests/fixtures/): bytes unchanged, and token
//! events, tokens, outcome and detected format whatever the framing.

use crate::support;

use bytes::Bytes;
use metronome::format::Accounting;
use metronome::scan::{scan_all, Event, Framing, DEFAULT_MAX_EVENT_BYTES};
use proptest::prelude::*;
use support::fixtures::FIXTURES;
use support::*;

fn text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[a-z é漢🙂\\\\\"\n]{0,12}").unwrap()
}

#[derive(Debug, Clone)]
enum Piece {
    Token(String),
    Empty,
    Comment,
    /// A token chunk whose JSON is split over two `data:` lines.
    MultiLine(String),
    Garbage,
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        6 => text().prop_map(Piece::Token),
        1 => Just(Piece::Empty),
        1 => Just(Piece::Comment),
        1 => text().prop_map(Piece::MultiLine),
        1 => Just(Piece::Garbage),
    ]
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(piece(), 1..30),
        prop_oneof![Just("\n"), Just("\r"), Just("\r\n")],
    )
        .prop_map(|(pieces, nl)| {
            let mut out = String::new();
            for p in pieces {
                match p {
                    Piece::Token(t) => {
                        let json = serde_json::json!({"model":"m","choices":[{"index":0,"delta":{"content":t}}]});
                        out += &format!("data: {json}{nl}{nl}");
                    }
                    Piece::Empty => out += &format!("data:{{\"model\":\"m\",\"choices\":[{{\"delta\":{{\"content\":\"\"}}}}]}}{nl}{nl}"),
                    Piece::Comment => out += &format!(": keep-alive{nl}{nl}"),
                    Piece::MultiLine(t) => {
                        let content = serde_json::to_string(&t).unwrap();
                        out += &format!("data: {{\"choices\":[{nl}data: {{\"delta\":{{\"content\":{content}}}}}]}}{nl}{nl}");
                    }
                    Piece::Garbage => out += &format!("data: {{not json{nl}{nl}"),
                }
            }
            out += &format!("data: [DONE]{nl}{nl}");
            out.into_bytes()
        })
}

fn cut(body: &[u8], mut cuts: Vec<usize>) -> Vec<Bytes> {
    cuts.retain(|c| *c > 0 && *c < body.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut frames = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain(std::iter::once(body.len())) {
        frames.push(Bytes::copy_from_slice(&body[start..c]));
        start = c;
    }
    frames
}

/// Events and token events by a one-shot parse of the whole body.
fn one_shot(body: &[u8]) -> (u64, u64) {
    let all = scan_all(Framing::Sse, body, DEFAULT_MAX_EVENT_BYTES);
    let mut accounting = Accounting::openai();
    let tokens = all
        .events
        .iter()
        .filter(|(kind, data, truncated)| {
            accounting
                .classify(&Event {
                    kind,
                    data,
                    truncated: *truncated,
                })
                .token_event
        })
        .count();
    (all.events.len() as u64, tokens as u64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn bytes_and_counts_survive_any_framing(
        body in stream(),
        cuts in proptest::collection::vec(0usize..4000, 0..25),
        pauses in proptest::collection::vec(any::<bool>(), 25),
    ) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let frames = cut(&body, cuts);
        let (events, token_events) = one_shot(&body);
        runtime.block_on(async move {
            // Pauses between some frames keep them apart on the wire.
            let steps = frames
                .into_iter()
                .enumerate()
                .map(|(i, f)| Step::Frame(if pauses[i % pauses.len()] { ms(2) } else { ms(0) }, f))
                .collect();
            let upstream = Upstream::script("text/event-stream", steps).start().await;
            let proxy = proxy_to(upstream.addr).await;
            let got = stream_chat(proxy.proxy_addr).await;
            assert!(got.error.is_none());
            assert_eq!(got.bytes(), body, "the client gets the upstream's bytes exactly");
            let m = scrape_after_stream(&proxy).await;
            let ingress = [("route", "chat"), ("point", "ingress")];
            assert_eq!(m.value("metronome_events_per_frame_sum", &ingress), events as f64);
            let egress = [("route", "chat"), ("point", "egress")];
            assert_eq!(m.value("metronome_events_per_frame_sum", &egress), events as f64);
            let itl = "metronome_inter_token_latency_seconds_count";
            let expected_gaps = token_events.saturating_sub(1) as f64;
            assert_eq!(m.value(itl, &ingress), expected_gaps);
            assert_eq!(m.value(itl, &egress), expected_gaps);
            proxy.shutdown().await;
        });
    }
}

/// Events in a fixture by a one-shot scan of the whole body.
fn fixture_events(content_type: &str, body: &[u8]) -> u64 {
    let framing = if content_type.contains("ndjson") {
        Framing::Ndjson
    } else {
        Framing::Sse
    };
    scan_all(framing, body, DEFAULT_MAX_EVENT_BYTES)
        .events
        .len() as u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 36, ..ProptestConfig::default() })]

    #[test]
    fn every_api_counts_the_same_in_any_framing(
        which in 0..FIXTURES.len(),
        cuts in proptest::collection::vec(0usize..6000, 0..40),
        pauses in proptest::collection::vec(any::<bool>(), 41),
    ) {
        let fixture = FIXTURES[which];
        let body = fixture.bytes();
        let events = fixture_events(fixture.content_type, &body);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let steps = cut(&body, cuts)
                .into_iter()
                .enumerate()
                .map(|(i, f)| Step::Frame(if pauses[i % pauses.len()] { ms(2) } else { ms(0) }, f))
                .collect();
            let upstream = Upstream::script(fixture.content_type, steps).start().await;
            let proxy = proxy_to(upstream.addr).await;
            let got = request(proxy.proxy_addr, "POST", fixture.path, "{}", false).await;
            assert!(got.error.is_none());
            assert_eq!(got.bytes(), body, "{}: the client gets the upstream's bytes exactly", fixture.file);
            let m = scrape_until(&proxy, |m| m.get("metronome_stream_format_total", &[]).is_some()).await;
            let what = fixture.file;
            for point in ["ingress", "egress"] {
                let at = [("point", point)];
                assert_eq!(m.value("metronome_events_per_frame_sum", &at), events as f64, "{what} {point}");
                assert_eq!(
                    m.value("metronome_inter_token_latency_seconds_count", &at),
                    (fixture.token_events - 1) as f64,
                    "{what} {point}"
                );
            }
            let (tokens, source) = fixture.tokens;
            assert_eq!(m.value("metronome_output_tokens_total", &[("source", source)]), tokens as f64, "{what}");
            assert_eq!(m.value("metronome_tokens_per_event_sum", &[]), fixture.tokens_per_event_sum as f64, "{what}");
            assert_eq!(m.value("metronome_streams_total", &[("outcome", fixture.outcome), ("model", fixture.model)]), 1.0, "{what}");
            assert_eq!(m.value("metronome_stream_format_total", &[("format", fixture.format)]), 1.0, "{what}");
            proxy.shutdown().await;
        });
    }
}
