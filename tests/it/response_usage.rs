//! Non-streaming answers' usage: each API's JSON answer, forwarded byte for byte through the
//! proxy, adds its reported usage to the token counters with the route and model it names, and
//! nothing else a stream has (no stream ID, no TTFT, no `/streams` entry). A body over
//! `metering.max_usage_body_bytes`, a malformed one, an error status, a compressed body, a body
//! cut short and a client gone mid-body add nothing.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use metronome::proxy::ProxyHandle;
use support::*;

/// What the client got, and the proxy's metrics once the answer has been recorded.
struct Answered {
    got: Received,
    metrics: Metrics,
}

/// Sends `POST path` through a proxy in front of `upstream`, and scrapes once the request is
/// counted in `metronome_request_duration_seconds` (recorded when its body has ended, after its
/// usage was read).
async fn answer_through(proxy: &ProxyHandle, path: &str) -> Answered {
    let got = request(proxy.proxy_addr, "POST", path, r#"{"stream":false}"#, false).await;
    let metrics = scrape_until(proxy, |m| {
        m.get("metronome_request_duration_seconds_count", &[])
            .is_some()
    })
    .await;
    Answered { got, metrics }
}

/// The answer to `path` from an upstream that answers `upstream`, through a fresh proxy with
/// the default configuration.
async fn answer(upstream: Upstream, path: &str) -> Answered {
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;
    let answered = answer_through(&proxy, path).await;
    assert_eq!(answered.got.bytes(), expected, "forwarded byte for byte");
    assert!(answered.got.error.is_none(), "{:?}", answered.got.error);
    answered
}

/// `[output, prompt, reasoning]` tokens on `route` for `model`.
fn tokens(m: &Metrics, route: &str, model: &str) -> [f64; 3] {
    let labels = [("route", route), ("model", model)];
    [
        m.value(
            "metronome_output_tokens_total",
            &[labels[0], labels[1], ("source", "usage")],
        ),
        m.value("metronome_prompt_tokens_total", &labels),
        m.value("metronome_reasoning_tokens_total", &labels),
    ]
}

/// Every token counter summed over its labels: what an answer that must add nothing is held to.
fn all_tokens(m: &Metrics) -> [f64; 3] {
    [
        m.value("metronome_output_tokens_total", &[]),
        m.value("metronome_prompt_tokens_total", &[]),
        m.value("metronome_reasoning_tokens_total", &[]),
    ]
}

/// Nothing a stream has: no stream ID header, no stream counted, no TTFT, no ITL.
fn no_stream(answered: &Answered) {
    assert!(!answered.got.headers.contains_key("x-metronome-stream-id"));
    let m = &answered.metrics;
    assert_eq!(m.get("metronome_streams_total", &[]), None);
    assert_eq!(
        m.get("metronome_time_to_first_token_seconds_count", &[]),
        None
    );
    assert_eq!(
        m.get("metronome_inter_token_latency_seconds_count", &[]),
        None
    );
}

#[tokio::test]
async fn each_api_answer_adds_its_usage() {
    let cases: &[(&str, &str, &str, &str, [f64; 3])] = &[
        (
            "/v1/chat/completions",
            "chat",
            "Qwen/Qwen3-8B",
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning_content":"hm"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"completion_tokens_details":{"reasoning_tokens":20}}}"#,
            [28.0, 12.0, 20.0],
        ),
        (
            "/v1/completions",
            "other",
            "m",
            r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"total_tokens":19,"completion_tokens":16}}"#,
            [16.0, 3.0, 0.0],
        ),
        (
            "/v1/responses",
            "other",
            "o4-mini",
            r#"{"id":"resp_1","object":"response","status":"completed","model":"o4-mini","output":[],"usage":{"input_tokens":37,"output_tokens":11,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":48}}"#,
            [11.0, 37.0, 4.0],
        ),
        (
            "/v1/messages",
            "other",
            "claude-x",
            r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"claude-x","stop_reason":"end_turn","usage":{"input_tokens":25,"output_tokens":15}}"#,
            [15.0, 25.0, 0.0],
        ),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "other",
            "gemini-2.5-flash",
            r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":11,"totalTokenCount":50,"thoughtsTokenCount":30},"modelVersion":"gemini-2.5-flash"}"#,
            [11.0, 9.0, 30.0],
        ),
        (
            "/api/chat",
            "other",
            "llama3.2",
            r#"{"model":"llama3.2","created_at":"2023-12-12T14:13:43.416799Z","message":{"role":"assistant","content":"Hello!"},"done":true,"done_reason":"stop","prompt_eval_count":26,"eval_count":298}"#,
            [298.0, 26.0, 0.0],
        ),
        (
            "/generate",
            "other",
            "unknown",
            r#"{"generated_text":"Deep learning is","details":{"finish_reason":"length","generated_tokens":20,"seed":null,"prefill":[],"tokens":[]}}"#,
            [20.0, 0.0, 0.0],
        ),
    ];
    for (path, route, model, body, want) in cases {
        for content_length in [false, true] {
            let mut upstream = Upstream::json(body);
            if content_length {
                upstream = upstream.with_content_length();
            }
            let answered = answer(upstream, path).await;
            let m = &answered.metrics;
            assert_eq!(
                tokens(m, route, model),
                *want,
                "{path} (content-length: {content_length})"
            );
            assert_eq!(all_tokens(m), *want, "{path}: nothing else");
            assert_eq!(m.get("metronome_unparsed_events_total", &[]), None);
            no_stream(&answered);
        }
    }
}

#[tokio::test]
async fn every_client_and_server_reads_the_answer_at_its_end() {
    use metronome::config::{ClientKind, ServerKind};
    const BODY: &str = r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
    for client in [ClientKind::Native, ClientKind::Hyper] {
        for (server, http2) in [
            (ServerKind::Native, false),
            (ServerKind::Hyper, false),
            (ServerKind::Native, true),
        ] {
            for content_length in [false, true] {
                let mut upstream = Upstream::json(BODY);
                if content_length {
                    upstream = upstream.with_content_length();
                }
                let upstream = upstream.start().await;
                let proxy = proxy_with(upstream.addr, |c| {
                    c.server.upstream_client = client;
                    c.server.http1_server = server;
                })
                .await;
                let path = "/v1/chat/completions";
                let got = request(proxy.proxy_addr, "POST", path, "{}", http2).await;
                assert_eq!(got.bytes(), BODY.as_bytes());
                let what = format!("{client:?} {server:?} http2={http2} length={content_length}");
                let m = scrape_until(&proxy, |m| {
                    m.get("metronome_output_tokens_total", &[]).is_some()
                })
                .await;
                assert_eq!(tokens(&m, "chat", "m"), [9.0, 5.0, 0.0], "{what}");
            }
        }
    }
}

#[tokio::test]
async fn an_answer_in_many_frames_is_read_whole_and_each_frame_passes_at_once() {
    const BODY: &str = r#"{"model":"m","choices":[{"message":{"content":"a long answer"}}],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
    let pieces: Vec<Step> = BODY
        .as_bytes()
        .chunks(16)
        .map(|c| Step::Frame(ms(40), Bytes::copy_from_slice(c)))
        .collect();
    let count = pieces.len();
    let answered = answer(
        Upstream::script("application/json", pieces),
        "/v1/chat/completions",
    )
    .await;
    assert_eq!(tokens(&answered.metrics, "chat", "m"), [9.0, 5.0, 0.0]);
    // Each frame reached the client as the upstream wrote it, 40 ms apart: none was held back
    // for the copy. (Generous margins: the gaps are only checked to be there at all.)
    let frames = &answered.got.frames;
    assert!(
        frames.len() >= count / 2,
        "{} frames of {count}",
        frames.len()
    );
    let spread = frames.last().unwrap().0 - frames[0].0;
    assert!(spread >= ms(40 * (count as u64 - 1) / 2), "{spread:?}");
}

#[tokio::test]
async fn a_body_over_the_bound_is_forwarded_untouched_and_counted_unread() {
    let body = format!(
        r#"{{"model":"m","choices":[{{"message":{{"content":"{}"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":9}}}}"#,
        "x".repeat(2000)
    );
    for content_length in [false, true] {
        let mut upstream = Upstream::script(
            "application/json",
            body.as_bytes()
                .chunks(700)
                .map(|c| Step::Frame(ms(5), Bytes::copy_from_slice(c)))
                .collect(),
        );
        if content_length {
            upstream = upstream.with_content_length();
        }
        let upstream = upstream.start().await;
        let proxy = proxy_with(upstream.addr, |c| c.metering.max_usage_body_bytes = 1024).await;
        let answered = answer_through(&proxy, "/v1/chat/completions").await;
        assert_eq!(answered.got.bytes(), body.as_bytes());
        let m = &answered.metrics;
        assert_eq!(all_tokens(m), [0.0; 3]);
        let oversize = [("route", "chat"), ("reason", "oversize")];
        assert_eq!(m.value("metronome_unparsed_events_total", &oversize), 1.0);
    }
}

#[tokio::test]
async fn malformed_error_compressed_and_unnamed_answers_add_nothing() {
    let usage = r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
    let malformed = answer(
        Upstream::json(r#"{"model":"m","usage":{"completion_tokens":9"#),
        "/v1/chat/completions",
    )
    .await;
    assert_eq!(all_tokens(&malformed.metrics), [0.0; 3]);
    let invalid = [("route", "chat"), ("reason", "invalid")];
    assert_eq!(
        malformed
            .metrics
            .value("metronome_unparsed_events_total", &invalid),
        1.0
    );
    for (upstream, path, what) in [
        (
            Upstream::json(usage).status(400),
            "/v1/chat/completions",
            "a 400",
        ),
        (
            Upstream::json(usage).status(503),
            "/v1/chat/completions",
            "a 503",
        ),
        (
            Upstream::json(usage).header("content-encoding", "gzip"),
            "/v1/chat/completions",
            "a gzip body",
        ),
        (
            Upstream::script(
                "text/plain",
                vec![Step::Frame(Duration::ZERO, Bytes::from(usage))],
            ),
            "/v1/chat/completions",
            "text/plain",
        ),
        (Upstream::json(usage), "/v1/embeddings", "a path of no API"),
    ] {
        let answered = answer(upstream, path).await;
        assert_eq!(all_tokens(&answered.metrics), [0.0; 3], "{what}");
        assert_eq!(
            answered.metrics.get("metronome_unparsed_events_total", &[]),
            None,
            "{what}"
        );
    }
}

#[tokio::test]
async fn metering_off_reads_nothing() {
    let usage = r#"{"model":"m","choices":[],"usage":{"completion_tokens":9}}"#;
    let upstream = Upstream::json(usage).start().await;
    let proxy = proxy_with(upstream.addr, |c| c.metering.enabled = false).await;
    let answered = answer_through(&proxy, "/v1/chat/completions").await;
    assert_eq!(answered.got.bytes(), usage.as_bytes());
    assert_eq!(all_tokens(&answered.metrics), [0.0; 3]);
}

#[tokio::test]
async fn a_body_cut_short_or_left_by_its_client_adds_nothing() {
    let usage = r#"{"model":"m","choices":[],"usage":{"completion_tokens":9}}"#;
    let (head, tail) = usage.split_at(20);
    // The upstream fails after the first half (a declared length never reached).
    let cut = Upstream::script(
        "application/json",
        vec![
            Step::Frame(Duration::ZERO, Bytes::from(head)),
            Step::Reset(ms(20)),
        ],
    )
    .start()
    .await;
    let proxy = proxy_to(cut.addr).await;
    let answered = answer_through(&proxy, "/v1/chat/completions").await;
    assert!(answered.got.error.is_some(), "the client sees the cut");
    assert_eq!(all_tokens(&answered.metrics), [0.0; 3]);
    let unread = answered.metrics.get("metronome_unparsed_events_total", &[]);
    assert_eq!(unread, None, "a cut body is not read at all");

    // The client goes away after the first half; the rest would have completed the answer.
    let left = Upstream::script(
        "application/json",
        vec![
            Step::Frame(Duration::ZERO, Bytes::from(head)),
            Step::Frame(ms(300), Bytes::from(tail)),
        ],
    )
    .start()
    .await;
    let proxy = proxy_to(left.addr).await;
    let client = tokio::spawn(request(
        proxy.proxy_addr,
        "POST",
        "/v1/chat/completions",
        "{}",
        false,
    ));
    tokio::time::sleep(ms(100)).await;
    client.abort();
    left.wait_for_a_cancel("the proxy let go of the upstream's answer")
        .await;
    let m = scrape_until(&proxy, |m| {
        m.get("metronome_request_duration_seconds_count", &[])
            .is_some()
    })
    .await;
    assert_eq!(all_tokens(&m), [0.0; 3]);
    assert_eq!(m.get("metronome_unparsed_events_total", &[]), None);
}
