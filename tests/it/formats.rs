//! Every supported streaming API through the real proxy: each fixture of tests/fixtures/ is
//! served by a scripted upstream, cut three ways (one frame, one byte per frame, random cuts),
//! fetched through the proxy, and the client's bytes and the proxy's metrics are checked against
//! the fixture table (tests/support/fixtures.rs): token events, token count and its source, TTFT
//! taken at the first token event, outcome, finish reason, input tokens, the per-request token
//! histogram, model and detected format. Counts are exact; durations have generous margins.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use metronome::config::{PathMatch, RouteConfig};
use metronome::format::Format;
use metronome::sim::{self, SimConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use support::fixtures::{frames, Fixture, FIXTURES};
use support::*;
use tokio::net::TcpListener;

const ITL: &str = "metronome_inter_token_latency_seconds_count";
const TTFT_COUNT: &str = "metronome_time_to_first_token_seconds_count";
const TTFT_SUM: &str = "metronome_time_to_first_token_seconds_sum";
const TTFB_SUM: &str = "metronome_time_to_first_byte_seconds_sum";
const FORMAT: &str = "metronome_stream_format_total";
const TOKENS_COUNT: &str = "metronome_request_tokens_count";
const TOKENS_SUM: &str = "metronome_request_tokens_sum";

/// The pause before the first token event. Everything before it is sent at once, so a TTFT of at
/// least this long shows it was taken at the token event and not at an earlier one.
const FIRST_TOKEN_DELAY: Duration = Duration::from_millis(300);

/// How a fixture is cut into the upstream's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The whole stream in one frame (after the delay).
    Whole,
    /// One byte per frame.
    OneByte,
    /// Random cuts and random 0 or 1 ms pauses, from this seed.
    Random(u64),
}

fn steps(body: &[u8], first_token: usize, cut: Cut) -> Vec<Step> {
    match cut {
        Cut::Whole => vec![Step::Frame(FIRST_TOKEN_DELAY, Bytes::copy_from_slice(body))],
        Cut::OneByte => frames(
            body,
            (1..body.len()).collect(),
            first_token,
            FIRST_TOKEN_DELAY,
            |_| Duration::ZERO,
        ),
        Cut::Random(seed) => {
            let mut rng = SmallRng::seed_from_u64(seed);
            let n = rng.gen_range(1..body.len() / 16 + 2);
            let cuts = (0..n).map(|_| rng.gen_range(1..body.len())).collect();
            let pauses: Vec<bool> = (0..64).map(|_| rng.gen_bool(0.3)).collect();
            frames(body, cuts, first_token, FIRST_TOKEN_DELAY, |i| {
                if pauses[i % pauses.len()] {
                    ms(1)
                } else {
                    Duration::ZERO
                }
            })
        }
    }
}

/// Replays `fixture` cut as `cut` and checks everything the table says about it.
async fn replay(fixture: &Fixture, cut: Cut) {
    let what = format!("{} ({cut:?})", fixture.file);
    let body = fixture.bytes();
    let first_token = fixture.first_token_offset(&body);
    let upstream = Upstream::script(fixture.content_type, steps(&body, first_token, cut))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;

    let got = request(
        proxy.proxy_addr,
        "POST",
        fixture.path,
        r#"{"stream":true}"#,
        false,
    )
    .await;
    assert_eq!(got.status, 200, "{what}");
    assert!(got.error.is_none(), "{what}: {:?}", got.error);
    assert_eq!(
        got.bytes(),
        body,
        "{what}: the client gets the fixture's bytes exactly"
    );

    let m = scrape_until(&proxy, |m| m.get(FORMAT, &[]).is_some()).await;
    let model = ("model", fixture.model);
    for point in ["ingress", "egress"] {
        let at = [model, ("point", point)];
        assert_eq!(
            m.value(ITL, &at),
            (fixture.token_events - 1) as f64,
            "{what} {point}: one gap per token event after the first"
        );
        assert_eq!(m.value(TTFT_COUNT, &at), 1.0, "{what} {point}");
        let ttft = m.value(TTFT_SUM, &at);
        assert!(
            ttft >= FIRST_TOKEN_DELAY.as_secs_f64(),
            "{what} {point}: TTFT {ttft}s is taken before the first token event"
        );
        if cut != Cut::Whole && first_token > 0 {
            let ttfb = m.value(TTFB_SUM, &[("point", point)]);
            assert!(
                ttfb < FIRST_TOKEN_DELAY.as_secs_f64(),
                "{what} {point}: the events before the first token event came at once ({ttfb}s)"
            );
        }
    }
    let (tokens, source) = fixture.tokens;
    assert_eq!(
        m.value(
            "metronome_output_tokens_total",
            &[model, ("source", source)]
        ),
        tokens as f64,
        "{what}: output tokens from {source}"
    );
    assert_eq!(
        m.value("metronome_output_tokens_total", &[]),
        tokens as f64,
        "{what}: one source only"
    );
    assert_eq!(
        m.value("metronome_tokens_per_event_count", &[model]),
        fixture.token_events as f64,
        "{what}"
    );
    assert_eq!(
        m.value("metronome_tokens_per_event_sum", &[model]),
        fixture.tokens_per_event_sum as f64,
        "{what}: exact tokens per event"
    );
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[model, ("outcome", fixture.outcome)]
        ),
        1.0,
        "{what}: outcome {} with model {}\n{}",
        fixture.outcome,
        fixture.model,
        m.0
    );
    assert_eq!(m.value("metronome_streams_total", &[]), 1.0, "{what}");
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("finish_reason", fixture.finish_reason)]
        ),
        1.0,
        "{what}: finish_reason {}\n{}",
        fixture.finish_reason,
        m.0
    );
    let input = [model, ("type", "input")];
    let prompt = fixture.prompt_tokens;
    assert_eq!(
        m.value(TOKENS_COUNT, &input),
        f64::from(u8::from(prompt.is_some())),
        "{what}: one input sample when the usage says"
    );
    assert_eq!(
        m.value(TOKENS_SUM, &input),
        prompt.unwrap_or(0) as f64,
        "{what}"
    );
    assert_eq!(
        m.value("metronome_prompt_tokens_total", &[model]),
        prompt.unwrap_or(0) as f64,
        "{what}"
    );
    let output = [model, ("type", "output")];
    assert_eq!(m.value(TOKENS_COUNT, &output), 1.0, "{what}");
    assert_eq!(m.value(TOKENS_SUM, &output), tokens as f64, "{what}");
    assert_eq!(
        m.value(FORMAT, &[("format", fixture.format)]),
        1.0,
        "{what}: format {}",
        fixture.format
    );
    assert_eq!(m.value(FORMAT, &[]), 1.0, "{what}: counted once");
    assert_eq!(
        m.value("metronome_unparsed_events_total", &[]),
        0.0,
        "{what}: every event was readable"
    );
    proxy.shutdown().await;
}

async fn replay_every_cut(file: &str, seed: u64) {
    let fixture = Fixture::named(file);
    for cut in [Cut::Whole, Cut::OneByte, Cut::Random(seed)] {
        replay(fixture, cut).await;
    }
}

macro_rules! fixture_tests {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                replay_every_cut($file, line!().into()).await;
            }
        )*

        #[test]
        fn every_fixture_has_a_test_and_a_row() {
            let tested = [$($file),*];
            let rows: Vec<&str> = FIXTURES.iter().map(|f| f.file).collect();
            let mut files: Vec<String> = std::fs::read_dir(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
            )
            .unwrap()
            .map(|e| e.unwrap())
            // Folders hold fixtures of another kind, with their own test (websocket/).
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".md"))
            .collect();
            files.sort();
            let mut sorted_rows = rows.clone();
            sorted_rows.sort();
            assert_eq!(files, sorted_rows, "every fixture file has a row in the table");
            for row in rows {
                assert!(tested.contains(&row), "{row} has no test");
            }
        }
    };
}

fixture_tests! {
    openai_chat_crlf_with_keep_alive_and_multibyte_text => "openai_chat_crlf_e2e.sse",
    openai_chat_from_vllm => "openai_chat_vllm.sse",
    openai_continuous_usage_and_multi_token_events => "openai_continuous_usage.sse",
    openai_completions_with_two_choices => "openai_completions_n2.sse",
    openai_token_ids => "openai_token_ids.sse",
    openai_error_mid_stream => "openai_error_midstream.sse",
    tgi_openai_route_without_spaces => "tgi_v1_chat.sse",
    tgi_generate_stream_with_keep_alive => "tgi_generate_stream.sse",
    tgi_error_mid_stream => "tgi_error.sse",
    llamacpp_completion => "llamacpp_completion.sse",
    llamacpp_legacy_error_line => "llamacpp_legacy_error.sse",
    sglang_cumulative_text => "sglang_generate.sse",
    ollama_chat => "ollama_chat.ndjson",
    ollama_generate => "ollama_generate.ndjson",
    openai_responses => "responses.sse",
    anthropic_messages_with_tool_use => "anthropic_messages.sse",
    anthropic_overloaded_mid_stream => "anthropic_overloaded.sse",
    gemini_with_crlf => "gemini_stream.sse",
    unknown_format_counts_every_event => "unknown_plain.sse",
}

/// Serves `fixture` whole at `path` through a proxy adjusted by `adjust`; returns the metrics.
async fn serve_at(
    fixture: &Fixture,
    path: &str,
    adjust: impl FnOnce(&mut metronome::config::Config),
) -> Metrics {
    let body = fixture.bytes();
    let upstream = Upstream::script(
        fixture.content_type,
        vec![Step::Frame(Duration::ZERO, Bytes::from(body.clone()))],
    )
    .start()
    .await;
    let proxy = proxy_with(upstream.addr, adjust).await;
    let got = request(proxy.proxy_addr, "POST", path, "{}", false).await;
    assert_eq!(got.bytes(), body);
    let m = scrape_until(&proxy, |m| m.get(FORMAT, &[]).is_some()).await;
    proxy.shutdown().await;
    m
}

#[tokio::test]
async fn the_first_event_outweighs_a_path_of_another_api() {
    // An OpenAI-compatible stream at SGLang's native path is still OpenAI.
    let m = serve_at(Fixture::named("openai_chat_vllm.sse"), "/generate", |_| {}).await;
    assert_eq!(m.value(FORMAT, &[("format", "openai")]), 1.0, "{}", m.0);
    assert_eq!(m.value(ITL, &[("point", "ingress")]), 7.0);
}

#[tokio::test]
async fn a_route_format_overrides_detection() {
    let m = serve_at(
        Fixture::named("anthropic_messages.sse"),
        "/v1/messages",
        |config| {
            config.routes.push(RouteConfig {
                name: "messages".into(),
                path: "/v1/messages".into(),
                match_kind: PathMatch::Exact,
                method: None,
                upstream: config.server.upstream.clone(),
                format: Some(Format::OpenAi),
                think: Default::default(),
            })
        },
    )
    .await;
    let route = ("route", "messages");
    assert_eq!(m.value(FORMAT, &[route, ("format", "openai")]), 1.0);
    assert_eq!(
        m.value("metronome_streams_total", &[route, ("outcome", "no_token")]),
        1.0,
        "Messages events read as OpenAI chunks show nothing"
    );
    assert_eq!(m.get(TTFT_COUNT, &[]), None);
}

#[tokio::test]
async fn sim_tgi_and_anthropic_streams_are_counted_exactly() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = sim::spawn(
        listener,
        SimConfig {
            gap: ms(3),
            ttft: ms(5),
            ..SimConfig::default()
        },
    )
    .unwrap();
    let proxy = proxy_to(sim.addr()).await;
    let tgi = r#"{"inputs":"hello","parameters":{"max_new_tokens":12}}"#;
    let got = request(proxy.proxy_addr, "POST", "/generate_stream", tgi, false).await;
    assert!(got.error.is_none());
    let messages = r#"{"model":"claude","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"hello"}]}"#;
    let got = request(proxy.proxy_addr, "POST", "/v1/messages", messages, false).await;
    assert!(got.error.is_none());

    let m = scrape_until(&proxy, |m| m.value(FORMAT, &[]) == 2.0).await;
    assert_eq!(m.value(FORMAT, &[("format", "tgi")]), 1.0);
    assert_eq!(m.value(FORMAT, &[("format", "anthropic")]), 1.0);
    // TGI: 12 tokens, one event each, then the special end-of-sequence token.
    let tgi = [("model", "unknown"), ("point", "ingress")];
    assert_eq!(m.value(ITL, &tgi), 11.0);
    assert_eq!(
        m.value(
            "metronome_output_tokens_total",
            &[("model", "unknown"), ("source", "counted")]
        ),
        13.0
    );
    // Anthropic: 12 text deltas after message_start, content_block_start and ping.
    let claude = [("model", "sim-model"), ("point", "ingress")];
    assert_eq!(m.value(ITL, &claude), 11.0);
    assert_eq!(
        m.value(
            "metronome_output_tokens_total",
            &[("model", "sim-model"), ("source", "usage")]
        ),
        12.0
    );
    assert_eq!(
        m.value("metronome_streams_total", &[("outcome", "complete")]),
        2.0
    );
    proxy.shutdown().await;
    sim.shutdown().await.unwrap();
}

/// An NDJSON stream whose last line, a token event, has no newline: that event completes only
/// when the body ends, after its bytes went out with the last frame. Both points count it (the
/// egress point used to miss it: one gap fewer than ingress).
#[tokio::test]
async fn a_last_ndjson_line_without_its_newline_counts_at_both_points() {
    let line = |text: &str| {
        format!(r#"{{"model":"llama3.2","response":"{text}","done":false}}"#).into_bytes()
    };
    let mut steps = Vec::new();
    for text in ["a", "b", "c"] {
        let mut frame = line(text);
        frame.push(b'\n');
        steps.push(Step::Frame(ms(5), Bytes::from(frame)));
    }
    steps.push(Step::Frame(ms(5), Bytes::from(line("d"))));
    let upstream = Upstream::script("application/x-ndjson", steps)
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let got = request(proxy.proxy_addr, "POST", "/api/generate", "{}", false).await;
    assert!(got.error.is_none(), "{:?}", got.error);

    let m = scrape_until(&proxy, |m| m.get(FORMAT, &[]).is_some()).await;
    assert_eq!(m.value(FORMAT, &[("format", "ollama")]), 1.0, "{}", m.0);
    for point in ["ingress", "egress"] {
        let at = [("point", point)];
        assert_eq!(m.value(ITL, &at), 3.0, "{point}: four token events");
        assert_eq!(
            m.value("metronome_events_per_frame_sum", &at),
            4.0,
            "{point}"
        );
    }
    proxy.shutdown().await;
}
