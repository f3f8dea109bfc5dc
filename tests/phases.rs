//! Phases through the proxy (docs/design.md section 3): for every API, a stream of reasoning
//! token events, a think pause, answer token events and tool-call token events gives exactly one
//! gap per token event after the first, each in the phase of the event that ends it, at ingress
//! and at egress; TTFT is at the first reasoning event and TTFO at the first answer event.
//!
//! The streams come from recorded fixtures (tests/fixtures/phases, written by
//! scripts/gen-phase-fixtures.py) replayed by the scripted upstream, and from `metronome sim`
//! in every API shape it serves. Counts are exact; times have generous margins.

mod support;

use std::time::Duration;

use bytes::Bytes;
use metronome::sim::{self, SimConfig};
use support::{
    ms, proxy_to, proxy_with, request, scrape_until, sim_agent, sim_with, Metrics, Step, Upstream,
};

const ITL: &str = "metronome_inter_token_latency_seconds_count";
const STALLS: &str = "metronome_stalls_total";
const TTFT: &str = "metronome_time_to_first_token_seconds_sum";
const TTFO: &str = "metronome_time_to_first_output_token_seconds_sum";
const TTFO_COUNT: &str = "metronome_time_to_first_output_token_seconds_count";
const REASONING: &str = "metronome_reasoning_duration_seconds_count";
const REASONING_TOKENS: &str = "metronome_reasoning_tokens_total";

/// A recorded stream with phases and what it holds.
struct PhaseFixture {
    file: &'static str,
    content_type: &'static str,
    path: &'static str,
    /// Token events of each phase: reasoning, content, tool_call.
    events: [u64; 3],
    /// The index of the event (all events, token events or not) the think pause comes before:
    /// the first answer event.
    pause_before: usize,
    /// The reasoning tokens the usage reports.
    reasoning_tokens: Option<u64>,
}

const SSE: &str = "text/event-stream";

const FIXTURES: &[PhaseFixture] = &[
    PhaseFixture {
        file: "openai_chat_reasoning_content.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        events: [3, 4, 2],
        pause_before: 4,
        reasoning_tokens: Some(3),
    },
    PhaseFixture {
        file: "openai_chat_reasoning.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        events: [3, 4, 2],
        pause_before: 4,
        reasoning_tokens: Some(3),
    },
    PhaseFixture {
        file: "openai_chat_think_tags.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        // `<thi`, `nk>`, three thoughts and `</think>`; the `\n\n` after it is content.
        events: [6, 5, 0],
        pause_before: 7,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "openai_completions_think_tags.sse",
        content_type: SSE,
        path: "/v1/completions",
        events: [5, 4, 0],
        pause_before: 5,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "responses_reasoning_summary.sse",
        content_type: SSE,
        path: "/v1/responses",
        events: [3, 4, 2],
        pause_before: 4,
        reasoning_tokens: Some(21),
    },
    PhaseFixture {
        file: "anthropic_thinking.sse",
        content_type: SSE,
        path: "/v1/messages",
        events: [3, 4, 2],
        pause_before: 8,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "ollama_thinking.ndjson",
        content_type: "application/x-ndjson",
        path: "/api/chat",
        events: [3, 4, 1],
        pause_before: 3,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "gemini_thoughts.sse",
        content_type: SSE,
        path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        events: [3, 4, 1],
        pause_before: 3,
        reasoning_tokens: Some(40),
    },
    PhaseFixture {
        file: "tgi_think_tags.sse",
        content_type: SSE,
        path: "/generate_stream",
        events: [5, 4, 0],
        pause_before: 5,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "llamacpp_think_tags.sse",
        content_type: SSE,
        path: "/completion",
        events: [5, 4, 0],
        pause_before: 5,
        reasoning_tokens: None,
    },
    PhaseFixture {
        file: "sglang_think_tags.sse",
        content_type: SSE,
        path: "/generate",
        events: [5, 4, 0],
        pause_before: 5,
        reasoning_tokens: None,
    },
];

const PHASES: [&str; 3] = ["reasoning", "content", "tool_call"];

fn fixture_bytes(file: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/phases/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap()
}

/// The fixture's events, each with the bytes that end it (a blank line, or a newline).
fn events_of(body: &[u8], ndjson: bool) -> Vec<Bytes> {
    let text = std::str::from_utf8(body).unwrap();
    let separator = if ndjson {
        "\n"
    } else if text.contains("\r\n\r\n") {
        "\r\n\r\n"
    } else {
        "\n\n"
    };
    text.split_inclusive(separator)
        .map(|e| Bytes::copy_from_slice(e.as_bytes()))
        .collect()
}

/// The gaps of each phase at `point`, and the stalls.
fn per_phase(m: &Metrics, point: &str) -> ([f64; 3], f64) {
    let gaps = PHASES.map(|p| m.value(ITL, &[("point", point), ("phase", p)]));
    (gaps, m.value(STALLS, &[("point", point)]))
}

/// What a stream of `events` (reasoning, content, tool_call token events, reasoning first)
/// must give at each point: one gap per token event but the very first.
fn expected_gaps(events: [u64; 3]) -> [f64; 3] {
    [
        events[0].saturating_sub(1) as f64,
        events[1] as f64,
        events[2] as f64,
    ]
}

async fn scrape_one_stream(proxy: &metronome::proxy::ProxyHandle) -> Metrics {
    scrape_until(proxy, |m| m.get("metronome_streams_total", &[]).is_some()).await
}

/// Every recorded API, one event a frame 10 ms apart and a 300 ms think pause before the first
/// answer event: exact gaps per phase at ingress and egress, TTFT at the first reasoning event,
/// TTFO at the first answer event, the pause a content stall, the reasoning tokens of the usage.
#[tokio::test]
async fn every_recorded_api_gives_exact_gaps_per_phase_and_ttfo_at_the_answer() {
    for fixture in FIXTURES {
        let body = fixture_bytes(fixture.file);
        let ndjson = fixture.content_type != SSE;
        let steps = events_of(&body, ndjson)
            .into_iter()
            .enumerate()
            .map(|(i, event)| {
                let wait = if i == fixture.pause_before {
                    ms(300)
                } else {
                    ms(10)
                };
                Step::Frame(wait, event)
            })
            .collect();
        let upstream = Upstream::script(fixture.content_type, steps).start_in_background();
        let proxy = proxy_to(upstream.addr).await;
        let got = request(proxy.proxy_addr, "POST", fixture.path, "{}", false).await;
        let what = fixture.file;
        assert_eq!(got.status, 200, "{what}");
        assert_eq!(got.bytes(), body, "{what}: the body is never touched");
        let m = scrape_one_stream(&proxy).await;
        assert_eq!(
            m.value("metronome_streams_total", &[("outcome", "complete")]),
            1.0,
            "{what}"
        );
        for point in ["ingress", "egress"] {
            let (gaps, stalls) = per_phase(&m, point);
            assert_eq!(gaps, expected_gaps(fixture.events), "{what} at {point}");
            assert_eq!(stalls, 1.0, "{what} at {point}: the think pause");
            assert_eq!(
                m.value(STALLS, &[("point", point), ("phase", "content")]),
                1.0,
                "{what} at {point}: the pause ends at an answer event"
            );
            let at = [("point", point)];
            let (ttft, ttfo) = (m.value(TTFT, &at), m.value(TTFO, &at));
            assert!(
                ttft < 0.25,
                "{what} at {point}: TTFT {ttft} is before the pause"
            );
            assert!(
                ttfo >= 0.3 && ttfo - ttft >= 0.28,
                "{what} at {point}: TTFO {ttfo} is after the pause, TTFT {ttft}"
            );
            assert_eq!(m.value(REASONING, &at), 1.0, "{what} at {point}");
        }
        assert_eq!(
            m.get(REASONING_TOKENS, &[]),
            fixture.reasoning_tokens.map(|n| n as f64),
            "{what}"
        );
        proxy.shutdown().await;
    }
}

/// The same streams cut into frames of 7 bytes, so tags, events and escapes are split across
/// frames: the per-phase gap counts are the same, and the body is the same.
#[tokio::test]
async fn phases_are_found_whatever_the_frames() {
    for fixture in FIXTURES {
        let body = fixture_bytes(fixture.file);
        let frames: Vec<Bytes> = body.chunks(7).map(Bytes::copy_from_slice).collect();
        let steps = frames
            .into_iter()
            .map(|f| Step::Frame(Duration::from_micros(200), f))
            .collect();
        let upstream = Upstream::script(fixture.content_type, steps).start_in_background();
        let proxy = proxy_to(upstream.addr).await;
        let got = request(proxy.proxy_addr, "POST", fixture.path, "{}", false).await;
        assert_eq!(got.bytes(), body, "{}", fixture.file);
        let m = scrape_one_stream(&proxy).await;
        for point in ["ingress", "egress"] {
            let (gaps, _) = per_phase(&m, point);
            assert_eq!(
                gaps,
                expected_gaps(fixture.events),
                "{} at {point}",
                fixture.file
            );
        }
        proxy.shutdown().await;
    }
}

/// Every API shape the sim serves, with the token events of each phase it streams for
/// [`sim_agent`]: the APIs without a reasoning field (completions, TGI) put the thinking inline,
/// its first token `<think>` and its last `</think>`; Ollama and Gemini send a call whole.
const SIM_SHAPES: [(&str, &str, &str, [u64; 3]); 7] = [
    (
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        "openai",
        [6, 5, 6],
    ),
    (
        "/v1/completions",
        r#"{"model":"m","stream":true,"prompt":"hi"}"#,
        "openai",
        [6, 5, 0],
    ),
    ("/generate_stream", r#"{"inputs":"hi"}"#, "tgi", [6, 5, 0]),
    (
        "/v1/messages",
        r#"{"model":"claude","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        "anthropic",
        [6, 5, 6],
    ),
    (
        "/v1/responses",
        r#"{"model":"m","stream":true,"input":"hi"}"#,
        "responses",
        [6, 5, 6],
    ),
    (
        "/api/chat",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        "ollama",
        [6, 5, 2],
    ),
    (
        "/v1beta/models/sim-model:streamGenerateContent?alt=sse",
        r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#,
        "gemini",
        [6, 5, 2],
    ),
];

/// The sim in every API shape it serves, through the proxy: exact gaps per phase at ingress and
/// egress, TTFT before the pause and TTFO after it. The Responses stream uses reasoning-summary
/// deltas, which were not even token events before phases.
#[tokio::test]
async fn every_sim_api_gives_exact_gaps_per_phase_through_the_proxy() {
    let sim = sim_with(sim_agent()).await;
    for (path, body, format, events) in SIM_SHAPES {
        let proxy = proxy_to(sim.addr()).await;
        let got = request(proxy.proxy_addr, "POST", path, body, false).await;
        assert_eq!(got.status, 200, "{path}");
        let m = scrape_one_stream(&proxy).await;
        assert_eq!(
            m.value("metronome_stream_format_total", &[("format", format)]),
            1.0,
            "{path}"
        );
        for point in ["ingress", "egress"] {
            let (gaps, stalls) = per_phase(&m, point);
            assert_eq!(gaps, expected_gaps(events), "{path} at {point}");
            assert_eq!(
                m.value(STALLS, &[("point", point), ("phase", "content")]),
                stalls,
                "{path} at {point}: only the pause stalls, and it ends at the answer"
            );
            let at = [("point", point)];
            let (ttft, ttfo) = (m.value(TTFT, &at), m.value(TTFO, &at));
            assert!(
                (0.015..0.35).contains(&ttft),
                "{path} at {point}: TTFT {ttft} is the first reasoning event"
            );
            assert!(
                ttfo >= 0.4 && ttfo - ttft >= 0.4,
                "{path} at {point}: TTFO {ttfo} is the first answer event, after the pause"
            );
        }
        proxy.shutdown().await;
    }
    sim.shutdown().await.unwrap();
}

/// A server without a reasoning parser, two ways: its thinking inline after `<think>`, and a
/// template that opened the thinking in the prompt (only `</think>` comes), which a route says
/// with `think_starts_open`. Without the route key, such a stream is all content.
#[tokio::test]
async fn the_no_parser_shapes_and_a_route_that_starts_in_reasoning() {
    let chat = SIM_SHAPES[0];
    for (tags, starts_open, events) in [
        (sim::ThinkTags::Inline, false, [6, 5, 6]),
        (sim::ThinkTags::OpenInPrompt, true, [6, 5, 6]),
        (sim::ThinkTags::OpenInPrompt, false, [0, 11, 6]),
    ] {
        let sim = sim_with(SimConfig {
            think_tags: tags,
            ..sim_agent()
        })
        .await;
        let proxy = proxy_with(sim.addr(), |config| {
            config.routes[0].think.start = if starts_open {
                metronome::format::ThinkStart::Open
            } else {
                metronome::format::ThinkStart::Detect
            };
        })
        .await;
        let got = request(proxy.proxy_addr, "POST", chat.0, chat.1, false).await;
        assert_eq!(got.status, 200);
        let m = scrape_one_stream(&proxy).await;
        for point in ["ingress", "egress"] {
            let (gaps, _) = per_phase(&m, point);
            let want = if events[0] == 0 {
                [0.0, events[1] as f64 - 1.0, events[2] as f64]
            } else {
                expected_gaps(events)
            };
            assert_eq!(
                gaps, want,
                "{tags:?}, starts open {starts_open}, at {point}"
            );
        }
        proxy.shutdown().await;
        sim.shutdown().await.unwrap();
    }
}

/// An OpenAI chat chunk whose delta is `delta`.
fn chunk(delta: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
    ))
}

/// Bad input: a stream cut off while reasoning records no TTFO and keeps its outcome; `<think>`
/// never closed stays reasoning to the end (no TTFO); `</think>` without an opening tag is
/// content. None of it changes a byte.
#[tokio::test]
async fn bad_input_keeps_outcomes_and_never_invents_an_answer() {
    let reasoning = |n: usize| -> Vec<Step> {
        (0..n)
            .map(|i| Step::Frame(ms(10), chunk(&format!(r#"{{"reasoning_content":"t{i}"}}"#))))
            .collect()
    };
    // Cut off while reasoning.
    let mut steps = reasoning(4);
    steps.push(Step::Reset(ms(10)));
    let upstream = Upstream::script(SSE, steps).start_in_background();
    let proxy = proxy_to(upstream.addr).await;
    let got = request(
        proxy.proxy_addr,
        "POST",
        "/v1/chat/completions",
        "{}",
        false,
    )
    .await;
    assert!(got.error.is_some(), "the client sees the cut");
    let m = scrape_one_stream(&proxy).await;
    assert_eq!(
        m.value("metronome_streams_total", &[("outcome", "upstream_error")]),
        1.0
    );
    assert_eq!(m.get(TTFO_COUNT, &[]).unwrap_or(0.0), 0.0, "no TTFO");
    assert_eq!(
        m.value(ITL, &[("point", "ingress"), ("phase", "reasoning")]),
        3.0
    );
    assert_eq!(m.value(REASONING, &[("point", "ingress")]), 1.0);
    proxy.shutdown().await;

    // `<think>` never closed, then a finish reason: all reasoning, finish reason kept.
    let mut steps: Vec<Step> = ["<think>", "a", "b", "c"]
        .iter()
        .map(|t| Step::Frame(ms(5), chunk(&format!(r#"{{"content":"{t}"}}"#))))
        .collect();
    steps.push(Step::Frame(
        ms(5),
        Bytes::from_static(
            b"data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n",
        ),
    ));
    let upstream = Upstream::script(SSE, steps).start_in_background();
    let proxy = proxy_to(upstream.addr).await;
    request(
        proxy.proxy_addr,
        "POST",
        "/v1/chat/completions",
        "{}",
        false,
    )
    .await;
    let m = scrape_one_stream(&proxy).await;
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("outcome", "complete"), ("finish_reason", "length")]
        ),
        1.0
    );
    assert_eq!(
        m.value(ITL, &[("point", "egress"), ("phase", "reasoning")]),
        3.0
    );
    assert_eq!(
        m.value(ITL, &[("point", "egress"), ("phase", "content")]),
        0.0
    );
    assert_eq!(m.get(TTFO_COUNT, &[]).unwrap_or(0.0), 0.0);
    proxy.shutdown().await;

    // `</think>` alone is content.
    let steps: Vec<Step> = ["</think>", "a", "b"]
        .iter()
        .map(|t| Step::Frame(ms(5), chunk(&format!(r#"{{"content":"{t}"}}"#))))
        .collect();
    let upstream = Upstream::script(SSE, steps).start_in_background();
    let proxy = proxy_to(upstream.addr).await;
    request(
        proxy.proxy_addr,
        "POST",
        "/v1/chat/completions",
        "{}",
        false,
    )
    .await;
    let m = scrape_one_stream(&proxy).await;
    assert_eq!(
        m.value(ITL, &[("point", "egress"), ("phase", "content")]),
        2.0
    );
    assert_eq!(
        m.value(ITL, &[("point", "egress"), ("phase", "reasoning")]),
        0.0
    );
    assert_eq!(m.value(TTFO_COUNT, &[("point", "egress")]), 1.0);
    proxy.shutdown().await;
}

/// `/streams` lists TTFO and the reasoning figures; `/streams/{id}` marks each frame's phase and
/// the runs where the phases turn.
#[tokio::test]
async fn the_timeline_marks_phases_and_the_list_has_ttfo() {
    let fixture = &FIXTURES[0];
    let body = fixture_bytes(fixture.file);
    let steps = events_of(&body, false)
        .into_iter()
        .map(|e| Step::Frame(ms(5), e))
        .collect();
    let upstream = Upstream::script(SSE, steps).start_in_background();
    let proxy = proxy_to(upstream.addr).await;
    let got = request(proxy.proxy_addr, "POST", fixture.path, "{}", false).await;
    let id = got.stream_id();
    scrape_one_stream(&proxy).await;
    let admin = proxy.admin_addr;
    let get = |path: String| async move {
        let got = request(admin, "GET", &path, "", false).await;
        serde_json::from_slice::<serde_json::Value>(&got.bytes()).unwrap()
    };
    let list = get("/streams".into()).await;
    let stream = &list["streams"][0];
    assert!(
        stream["ttfo_us"]["egress"].as_u64().unwrap()
            > stream["ttft_us"]["egress"].as_u64().unwrap()
    );
    assert!(stream["reasoning_us"]["ingress"].as_u64().is_some());
    assert_eq!(stream["reasoning_tokens"], 3);
    let detail = get(format!("/streams/{id}")).await;
    let marks: Vec<&str> = detail["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["phase"].as_str())
        .collect();
    assert_eq!(
        marks,
        [
            "reasoning",
            "reasoning",
            "reasoning",
            "content",
            "content",
            "content",
            "content",
            "tool_call",
            "tool_call"
        ]
    );
    let runs: Vec<(&str, u64)> = detail["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["phase"].as_str().unwrap(),
                r["token_events"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(runs, [("reasoning", 3), ("content", 4), ("tool_call", 2)]);
    assert_eq!(detail["phases"][1]["first_frame"], 4);
    proxy.shutdown().await;
}

/// The probe reads the phases with the proxy's own accountants: through the proxy, its TTFO of
/// each stream agrees with the proxy's egress TTFO (within a generous margin: the probe counts
/// from the moment it sent, the proxy from the moment it received), and its per-phase gap
/// counts equal the proxy's egress counts exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_ttfo_and_gaps_per_phase_agree_with_the_proxys() {
    use metronome::probe::{measure, summarize, Load, Phase, ProbeConfig, Stop};
    let sim = sim_with(sim_agent()).await;
    let proxy = proxy_to(sim.addr()).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let mut config = ProbeConfig::new(&url, "m").unwrap();
    config.stop = Stop::Requests(4);
    config.load = Load::Closed { concurrency: 2 };
    config.timeout = Duration::from_secs(10);
    let run = measure(&config).await.unwrap();
    let report = summarize(&run, config.stall_threshold);
    assert_eq!(report.errors, 0);
    let m = scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) >= 4.0).await;
    // Per phase, the gaps that end at its token events, counted from the probe's records.
    let mut probe_gaps = [0u64; 3];
    for stream in &run.streams {
        let phases: Vec<Phase> = stream.phased_tokens().unwrap().map(|(_, p)| p).collect();
        for phase in &phases[1..] {
            probe_gaps[phase.index()] += 1;
        }
    }
    // R-1 reasoning and T tool-call gaps per stream; the answer is as long as the probe asks.
    assert_eq!(
        (probe_gaps[0], probe_gaps[2]),
        (4 * 5, 4 * 6),
        "{probe_gaps:?}"
    );
    let proxy_gaps = PHASES.map(|p| m.value(ITL, &[("point", "egress"), ("phase", p)]) as u64);
    assert_eq!(
        probe_gaps, proxy_gaps,
        "the probe and the proxy count the same gaps"
    );
    assert_eq!(m.value(TTFO_COUNT, &[("point", "egress")]), 4.0);
    let ttfo = report.ttfo_ms.p50.unwrap();
    assert!(
        ttfo >= 400.0,
        "the probe's TTFO {ttfo} ms is after the think pause"
    );
    assert!(
        report.ttft_ms.p50.unwrap() < 300.0,
        "TTFT is the first thought"
    );
    // Stream by stream, against `/streams`.
    let ids: Vec<&str> = (run.streams.iter())
        .filter_map(|s| s.stream_id.as_deref())
        .collect();
    let list = listed_streams(proxy.admin_addr, &ids).await;
    for stream in &run.streams {
        let id = stream.stream_id.as_deref().unwrap();
        let entry = list.iter().find(|s| s["id"] == id).unwrap();
        let proxy_ms = entry["ttfo_us"]["egress"].as_u64().unwrap() as f64 / 1e3;
        let first_output = stream
            .phased_tokens()
            .unwrap()
            .find(|(_, p)| *p != Phase::Reasoning)
            .unwrap()
            .0;
        let probe_ms = first_output.duration_since(stream.scheduled).as_secs_f64() * 1e3;
        assert!(
            (probe_ms - proxy_ms).abs() < 150.0,
            "stream {id}: the probe's TTFO {probe_ms:.1} ms, the proxy's {proxy_ms:.1} ms"
        );
    }
    proxy.shutdown().await;
    sim.shutdown().await.unwrap();
}

/// `/streams`' entries once every stream in `ids` is among them: a stream joins the list when the
/// proxy has finished with it, which can come a moment after the probe read its last byte
/// (waits at most 10 s, then returns the list as it is).
async fn listed_streams(admin: std::net::SocketAddr, ids: &[&str]) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = request(admin, "GET", "/streams", "", false).await;
        let list: serde_json::Value = serde_json::from_slice(&list.bytes()).unwrap();
        let list = list["streams"].as_array().unwrap().clone();
        let listed = |id: &&str| list.iter().any(|s| s["id"] == *id);
        if ids.iter().all(listed) || std::time::Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Probes `proxy` with `think` (the probe's `--think-tags` and `--think-starts-open`) for
/// `streams` streams; each stream's TTFO in ms at the probe (from sending) and at the proxy's
/// egress (from `/streams`, from receiving).
async fn probe_and_proxy_ttfo(
    proxy: &metronome::proxy::ProxyHandle,
    think: metronome::format::ThinkSettings,
    streams: u64,
) -> Vec<(f64, f64)> {
    use metronome::probe::{measure, Phase, ProbeConfig, Stop};
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let mut config = ProbeConfig::new(&url, "m").unwrap();
    config.stop = Stop::Requests(streams);
    config.timeout = Duration::from_secs(10);
    config.think = think;
    let run = measure(&config).await.unwrap();
    let ids: Vec<&str> = (run.streams.iter())
        .filter_map(|s| s.stream_id.as_deref())
        .collect();
    let list = listed_streams(proxy.admin_addr, &ids).await;
    run.streams
        .iter()
        .map(|stream| {
            assert_eq!(stream.error, None);
            let id = stream.stream_id.as_deref().unwrap();
            let entry = list.iter().find(|s| s["id"] == id).unwrap();
            let proxy_ms = entry["ttfo_us"]["egress"].as_u64().unwrap() as f64 / 1e3;
            let first_output = (stream.phased_tokens().unwrap())
                .find(|(_, p)| *p != Phase::Reasoning)
                .unwrap()
                .0;
            let probe_ms = first_output.duration_since(stream.scheduled).as_secs_f64() * 1e3;
            (probe_ms, proxy_ms)
        })
        .collect()
}

/// The probe reads the no-parser shapes as the proxy does when it is told what the route is
/// told: custom tags (`--think-tags`, a route's `think_tags`) and a template that opens the
/// thinking in the prompt (`--think-starts-open`). Its TTFO is then the proxy's (the margin is
/// the loaded machine's, not the method's: the answer follows a 400 ms pause, frames 5 ms
/// apart); told nothing, it takes the thinking for the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_think_tags_give_the_proxys_ttfo() {
    use metronome::format::{ThinkSettings, ThinkStart, ThinkTags};
    let tags = ThinkTags::new("<reason>", "</reason>").map(std::sync::Arc::new);
    let custom = ThinkSettings {
        tags,
        start: ThinkStart::Detect,
    };
    let opened = ThinkSettings {
        tags: None,
        start: ThinkStart::Open,
    };
    // Custom tags, split across events, in an OpenAI chat stream's content.
    let mut steps: Vec<Step> = ["<rea", "son>", "a", "b", "c</reason>"]
        .iter()
        .map(|t| Step::Frame(ms(5), chunk(&format!(r#"{{"content":"{t}"}}"#))))
        .collect();
    steps.push(Step::Frame(ms(400), chunk(r#"{"content":"Hello"}"#)));
    steps.push(Step::Frame(ms(5), chunk(r#"{"content":" there"}"#)));
    steps.push(Step::Frame(ms(5), Bytes::from_static(b"data: [DONE]\n\n")));
    let upstream = Upstream::script(SSE, steps).start_in_background();
    // The sim's template-opened thinking: only `</think>` comes.
    let sim = sim_with(SimConfig {
        think_tags: sim::ThinkTags::OpenInPrompt,
        ..sim_agent()
    })
    .await;
    for (addr, think) in [(upstream.addr, custom), (sim.addr(), opened)] {
        let route_think = think.clone();
        let proxy = proxy_with(addr, |config| config.routes[0].think = route_think).await;
        for (probe_ms, proxy_ms) in probe_and_proxy_ttfo(&proxy, think.clone(), 2).await {
            assert!(
                proxy_ms >= 400.0,
                "{think:?}: the proxy's TTFO {proxy_ms} ms"
            );
            assert!(
                (probe_ms - proxy_ms).abs() < 150.0,
                "{think:?}: the probe's TTFO {probe_ms:.1} ms, the proxy's {proxy_ms:.1} ms"
            );
        }
        for (probe_ms, _) in probe_and_proxy_ttfo(&proxy, ThinkSettings::default(), 1).await {
            assert!(probe_ms < 300.0, "{think:?}: told nothing, {probe_ms} ms");
        }
        proxy.shutdown().await;
    }
    sim.shutdown().await.unwrap();
}

/// A route's think keys are read and checked: two tags of 1 to 64 bytes.
#[test]
fn a_route_names_its_think_tags_and_whether_it_starts_open() {
    use metronome::config::Config;
    let route = |keys: &str| {
        format!(
            "[server]\nupstream = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\npath = \"/\"\n{keys}\n"
        )
    };
    let config = Config::from_toml(&route(
        "think_tags = [\"<reason>\", \"</reason>\"]\nthink_starts_open = true",
    ))
    .unwrap();
    let think = &config.routes[0].think;
    assert_eq!(think.start, metronome::format::ThinkStart::Open);
    assert_eq!(
        think.tags.as_deref(),
        metronome::format::ThinkTags::new("<reason>", "</reason>").as_ref()
    );
    for bad in [
        "think_tags = [\"<think>\"]",
        "think_tags = [\"\", \"</think>\"]",
    ] {
        let err = Config::from_toml(&route(bad)).unwrap_err().to_string();
        assert!(err.contains("think_tags"), "{bad}: {err}");
    }
}
