//! `metronome sim`'s phases end to end: a real sim on 127.0.0.1:0 streams, in every API shape it
//! serves, R reasoning token events, a think pause, C answer token events and T tool-call token
//! events; a client stamps every frame as it arrives and reads each event's phase from the wire
//! with its own reader (below, independent of metronome's accountants). Counts are exact; the
//! pause is checked with generous margins. The last tests put the proxy in front and check what
//! it measures of the same streams.

use crate::support;

use std::time::{Duration, Instant};

use metronome::scan::{CollectedEvents, Framing, Scanner};
use metronome::sim::{self, SimConfig, ThinkTags};
use serde_json::Value;
use support::{ms, proxy_to, request, scrape_until, sim_agent, sim_with, Received};

/// The phase of a token event, as the client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reasoning,
    Content,
    ToolCall,
}

/// What one event carries, by the API's fields: text (the answer, or thinking between think
/// tags), reasoning in a field of its own, or tool-call arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Carries {
    Text(String),
    Reasoning,
    ToolCall,
}

/// One API shape as a client uses it.
struct Shape {
    name: &'static str,
    path: &'static str,
    body: &'static str,
    framing: Framing,
    /// Tool-call token events per tool call of `A` argument tokens: `A`, or 1 where the API
    /// sends a call whole; `None` where the API has no tool calls.
    tool_events_per_call: fn(u64) -> Option<u64>,
    carries: fn(&Value) -> Option<Carries>,
}

fn non_empty(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn chat(v: &Value) -> Option<Carries> {
    if let Some(text) = non_empty(v, "/choices/0/delta/content") {
        return Some(Carries::Text(text));
    }
    if non_empty(v, "/choices/0/delta/tool_calls/0/function/arguments").is_some() {
        return Some(Carries::ToolCall);
    }
    let reasoning = non_empty(v, "/choices/0/delta/reasoning_content")
        .or_else(|| non_empty(v, "/choices/0/delta/reasoning"));
    reasoning.map(|_| Carries::Reasoning)
}

fn completions(v: &Value) -> Option<Carries> {
    non_empty(v, "/choices/0/text").map(Carries::Text)
}

fn tgi(v: &Value) -> Option<Carries> {
    if v.pointer("/token/special") == Some(&Value::Bool(true)) {
        return None;
    }
    non_empty(v, "/token/text").map(Carries::Text)
}

fn anthropic(v: &Value) -> Option<Carries> {
    match v.pointer("/delta/type").and_then(Value::as_str)? {
        "text_delta" => non_empty(v, "/delta/text").map(Carries::Text),
        "thinking_delta" => non_empty(v, "/delta/thinking").map(|_| Carries::Reasoning),
        "input_json_delta" => non_empty(v, "/delta/partial_json").map(|_| Carries::ToolCall),
        _ => None,
    }
}

fn responses(v: &Value) -> Option<Carries> {
    let delta = non_empty(v, "/delta")?;
    match v["type"].as_str()? {
        "response.output_text.delta" => Some(Carries::Text(delta)),
        "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            Some(Carries::Reasoning)
        }
        "response.function_call_arguments.delta" => Some(Carries::ToolCall),
        _ => None,
    }
}

fn ollama(v: &Value) -> Option<Carries> {
    if let Some(text) = non_empty(v, "/message/content") {
        return Some(Carries::Text(text));
    }
    if v.pointer("/message/tool_calls/0/function").is_some() {
        return Some(Carries::ToolCall);
    }
    non_empty(v, "/message/thinking").map(|_| Carries::Reasoning)
}

fn gemini(v: &Value) -> Option<Carries> {
    let parts = v.pointer("/candidates/0/content/parts")?.as_array()?;
    let text: String = parts
        .iter()
        .filter(|p| p["thought"] != Value::Bool(true))
        .filter_map(|p| p["text"].as_str())
        .collect();
    if !text.is_empty() {
        return Some(Carries::Text(text));
    }
    if parts.iter().any(|p| p.get("functionCall").is_some()) {
        return Some(Carries::ToolCall);
    }
    let thought = parts.iter().any(|p| {
        p["thought"] == Value::Bool(true) && p["text"].as_str().is_some_and(|t| !t.is_empty())
    });
    thought.then_some(Carries::Reasoning)
}

fn streams_arguments(a: u64) -> Option<u64> {
    Some(a)
}

fn sends_calls_whole(_: u64) -> Option<u64> {
    Some(1)
}

fn has_no_tools(_: u64) -> Option<u64> {
    None
}

const CHAT: Shape = Shape {
    name: "chat",
    path: "/v1/chat/completions",
    body: r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    framing: Framing::Sse,
    tool_events_per_call: streams_arguments,
    carries: chat,
};

/// Every shape the sim serves.
const SHAPES: [Shape; 7] = [
    CHAT,
    Shape {
        name: "completions",
        path: "/v1/completions",
        body: r#"{"model":"m","stream":true,"prompt":"hi"}"#,
        framing: Framing::Sse,
        tool_events_per_call: has_no_tools,
        carries: completions,
    },
    Shape {
        name: "tgi",
        path: "/generate_stream",
        body: r#"{"inputs":"hi"}"#,
        framing: Framing::Sse,
        tool_events_per_call: has_no_tools,
        carries: tgi,
    },
    Shape {
        name: "anthropic",
        path: "/v1/messages",
        body: r#"{"model":"claude","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        framing: Framing::Sse,
        tool_events_per_call: streams_arguments,
        carries: anthropic,
    },
    Shape {
        name: "responses",
        path: "/v1/responses",
        body: r#"{"model":"m","stream":true,"input":"hi"}"#,
        framing: Framing::Sse,
        tool_events_per_call: streams_arguments,
        carries: responses,
    },
    Shape {
        name: "ollama",
        path: "/api/chat",
        body: r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        framing: Framing::Ndjson,
        tool_events_per_call: sends_calls_whole,
        carries: ollama,
    },
    Shape {
        name: "gemini",
        path: "/v1beta/models/sim-model:streamGenerateContent?alt=sse",
        body: r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#,
        framing: Framing::Sse,
        tool_events_per_call: sends_calls_whole,
        carries: gemini,
    },
];

/// The phase of text events, from the think tags: text is thinking from an opening `<think>`
/// (or from the start, when the thinking was opened in the prompt) to the event with `</think>`.
#[derive(Debug)]
struct TagReader {
    thinking: Option<bool>,
}

impl TagReader {
    fn new(opened_in_prompt: bool) -> Self {
        TagReader {
            thinking: opened_in_prompt.then_some(true),
        }
    }

    fn phase(&mut self, text: &str) -> Phase {
        let thinking = *self.thinking.get_or_insert(text.starts_with("<think>"));
        if !thinking {
            return Phase::Content;
        }
        if text.contains("</think>") {
            self.thinking = Some(false);
        }
        Phase::Reasoning
    }
}

/// Each token event of a response with its arrival, its phase and its text (if text).
fn token_events(
    got: &Received,
    shape: &Shape,
    opened_in_prompt: bool,
) -> Vec<(Instant, Phase, String)> {
    let mut scanner = Scanner::new(shape.framing, 1 << 20);
    let mut tags = TagReader::new(opened_in_prompt);
    let mut out = Vec::new();
    for (at, frame) in &got.frames {
        let mut sink = CollectedEvents::default();
        scanner.feed(frame, &mut sink);
        for (_, data, _) in &sink.events {
            let Ok(value) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            match (shape.carries)(&value) {
                Some(Carries::Text(text)) => out.push((*at, tags.phase(&text), text)),
                Some(Carries::Reasoning) => out.push((*at, Phase::Reasoning, String::new())),
                Some(Carries::ToolCall) => out.push((*at, Phase::ToolCall, String::new())),
                None => {}
            }
        }
    }
    out
}

/// The phases of the events, run-length encoded.
fn runs(events: &[(Instant, Phase, String)]) -> Vec<(Phase, u64)> {
    let mut runs: Vec<(Phase, u64)> = Vec::new();
    for (_, phase, _) in events {
        match runs.last_mut() {
            Some((last, n)) if last == phase => *n += 1,
            _ => runs.push((*phase, 1)),
        }
    }
    runs
}

/// The runs a stream of `r` reasoning, `c` answer and `n` calls of `a` argument tokens has in
/// `shape`, one token event per token (no speculative decoding).
fn expected_runs(shape: &Shape, r: u64, c: u64, n: u64, a: u64) -> Vec<(Phase, u64)> {
    let mut runs = vec![(Phase::Reasoning, r), (Phase::Content, c)];
    if let Some(per_call) = (shape.tool_events_per_call)(a) {
        runs.push((Phase::ToolCall, n * per_call));
    }
    runs.retain(|(_, n)| *n > 0);
    runs
}

/// The indexes of the gaps (between consecutive token events) longer than `limit`.
fn long_gaps(events: &[(Instant, Phase, String)], limit: Duration) -> Vec<usize> {
    events
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1].0 - w[0].0 > limit)
        .map(|(i, _)| i)
        .collect()
}

async fn stream(sim: &sim::SimHandle, shape: &Shape, extra: &str) -> Received {
    let body = match extra {
        "" => shape.body.to_owned(),
        extra => format!("{},{extra}}}", shape.body.trim_end_matches('}')),
    };
    let got = request(sim.addr(), "POST", shape.path, &body, false).await;
    assert_eq!(got.status, 200, "{}", shape.name);
    assert!(got.error.is_none(), "{}", shape.name);
    got
}

/// The pause is the only long gap, and it ends the reasoning: the gap before the first answer
/// token event.
fn assert_the_pause_is_the_one_long_gap(events: &[(Instant, Phase, String)], what: &str) {
    let first_answer = events
        .iter()
        .position(|(_, p, _)| *p != Phase::Reasoning)
        .unwrap();
    assert_eq!(
        long_gaps(events, ms(200)),
        [first_answer - 1],
        "{what}: the think pause, and only it"
    );
}

#[tokio::test]
async fn every_api_streams_reasoning_a_pause_the_answer_and_tool_calls() {
    let sim = sim_with(sim_agent()).await;
    let sent = Instant::now();
    let all =
        futures_util::future::join_all(SHAPES.iter().map(|shape| stream(&sim, shape, ""))).await;
    let mut served = (0, 0, 0);
    for (shape, got) in SHAPES.iter().zip(&all) {
        let events = token_events(got, shape, false);
        let expected = expected_runs(shape, 6, 5, 2, 3);
        assert_eq!(runs(&events), expected, "{}", shape.name);
        assert_the_pause_is_the_one_long_gap(&events, shape.name);
        assert!(events[0].0 - sent >= ms(15), "{}: TTFT", shape.name);
        let first_answer = events
            .iter()
            .find(|(_, p, _)| *p == Phase::Content)
            .unwrap();
        assert!(
            first_answer.0 - sent >= ms(20 + 5 * 5 + 400),
            "{}: TTFO after the reasoning and the pause",
            shape.name
        );
        served.0 += 6;
        served.1 += 5;
        served.2 += expected.get(2).map_or(0, |(_, n)| *n);
    }
    let snap = sim.stats().snapshot();
    assert_eq!(
        (
            snap.reasoning_events,
            snap.content_events,
            snap.tool_call_events
        ),
        served,
        "the sim's own count of what it served, by phase"
    );
    assert_eq!(snap.completed, SHAPES.len() as u64);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_a_parser_the_thinking_is_text_between_think_tags() {
    let sim = sim_with(SimConfig {
        think_tags: ThinkTags::Inline,
        ..sim_agent()
    })
    .await;
    let all =
        futures_util::future::join_all(SHAPES.iter().map(|shape| stream(&sim, shape, ""))).await;
    for (shape, got) in SHAPES.iter().zip(&all) {
        let events = token_events(got, shape, false);
        assert_eq!(
            runs(&events),
            expected_runs(shape, 6, 5, 2, 3),
            "{}",
            shape.name
        );
        let texts: Vec<&str> = events.iter().map(|(_, _, t)| t.as_str()).collect();
        assert_eq!(
            texts[0], "<think>",
            "{}: the opening tag is a token",
            shape.name
        );
        assert_eq!(
            texts[5], "</think>",
            "{}: so is the closing one",
            shape.name
        );
        assert!(texts[6].starts_with(" tok"), "{}", shape.name);
        assert_the_pause_is_the_one_long_gap(&events, shape.name);
    }
    // A chat template that opens the thinking in the prompt: only the closing tag is sent.
    let open = r#""sim_think_tags":"open-in-prompt""#;
    let all =
        futures_util::future::join_all(SHAPES.iter().map(|shape| stream(&sim, shape, open))).await;
    for (shape, got) in SHAPES.iter().zip(&all) {
        let events = token_events(got, shape, true);
        assert_eq!(
            runs(&events),
            expected_runs(shape, 6, 5, 2, 3),
            "{}",
            shape.name
        );
        assert!(events.iter().all(|(_, _, t)| !t.contains("<think>")));
        assert_eq!(events[5].2, "</think>", "{}", shape.name);
    }
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_sets_its_own_phases_and_the_apis_budgets_cap_them() {
    let sim = sim_with(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        tokens: 4,
        ..SimConfig::default()
    })
    .await;
    let own = r#""sim_reasoning_tokens":7,"sim_think_pause_ms":300,"sim_tool_calls":1,"sim_tool_call_tokens":2,"sim_reasoning_field":"reasoning""#;
    let got = stream(&sim, &CHAT, own).await;
    let events = token_events(&got, &CHAT, false);
    assert_eq!(
        runs(&events),
        [
            (Phase::Reasoning, 7),
            (Phase::Content, 4),
            (Phase::ToolCall, 2)
        ]
    );
    assert_the_pause_is_the_one_long_gap(&events, "chat");
    let body = String::from_utf8(got.bytes()).unwrap();
    assert!(body.contains(r#""delta":{"reasoning":" idea"#), "{body}");
    assert!(!body.contains("reasoning_content"));
    assert!(body.contains(r#""finish_reason":"tool_calls""#));

    let capped = r#""sim_reasoning_tokens":7,"thinking_token_budget":3"#;
    let events = token_events(&stream(&sim, &CHAT, capped).await, &CHAT, false);
    assert_eq!(runs(&events), [(Phase::Reasoning, 3), (Phase::Content, 4)]);
    let off = r#""sim_reasoning_tokens":7,"chat_template_kwargs":{"enable_thinking":false}"#;
    let events = token_events(&stream(&sim, &CHAT, off).await, &CHAT, false);
    assert_eq!(runs(&events), [(Phase::Content, 4)]);
    let anthropic = &SHAPES[3];
    let budget = r#""sim_reasoning_tokens":7,"thinking":{"type":"enabled","budget_tokens":2}"#;
    let events = token_events(&stream(&sim, anthropic, budget).await, anthropic, false);
    assert_eq!(runs(&events), [(Phase::Reasoning, 2), (Phase::Content, 5)]);
    sim.shutdown().await.unwrap();
}

/// `--engine batch`: the reasoning, the answer and the calls come one token per step of the
/// shared loop, and a stream's think pause keeps only that stream out of the steps.
#[tokio::test]
async fn the_batch_engine_streams_phases_and_pauses_one_stream_alone() {
    let sim = sim_with(SimConfig {
        engine: sim::Engine::Batch,
        gap: ms(10),
        tokens: 5,
        ..SimConfig::default()
    })
    .await;
    let thinker = r#""sim_reasoning_tokens":5,"sim_think_pause_ms":400,"sim_tool_calls":1,"sim_tool_call_tokens":3,"sim_prompt_tokens":1"#;
    let steady = r#""max_tokens":60,"sim_prompt_tokens":1"#;
    let (thinker, steady) = tokio::join!(stream(&sim, &CHAT, thinker), stream(&sim, &CHAT, steady));
    let events = token_events(&thinker, &CHAT, false);
    assert_eq!(
        runs(&events),
        [
            (Phase::Reasoning, 5),
            (Phase::Content, 5),
            (Phase::ToolCall, 3)
        ]
    );
    assert_the_pause_is_the_one_long_gap(&events, "the thinker");
    let steady = token_events(&steady, &CHAT, false);
    assert_eq!(runs(&steady), [(Phase::Content, 60)]);
    assert_eq!(
        long_gaps(&steady, ms(200)),
        Vec::<usize>::new(),
        "the pause is the thinker's own"
    );
    sim.shutdown().await.unwrap();
}

/// The `--timeline` file says how many token events of each phase every frame holds, and marks
/// the think pause on the frame after it.
#[tokio::test]
async fn the_timeline_records_each_frames_phases_and_the_pause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.jsonl");
    let sim = sim_with(SimConfig {
        coalesce: 2,
        timeline: Some(path.clone()),
        ..sim_agent()
    })
    .await;
    let got = stream(&sim, &CHAT, "").await;
    assert_eq!(
        runs(&token_events(&got, &CHAT, false)),
        expected_runs(&CHAT, 6, 5, 2, 3)
    );
    sim.shutdown().await.unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let frames: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("event").is_some())
        .collect();
    let count = |f: &Value, key: &str| f[key].as_u64().unwrap_or(0);
    let sum = |key: &str| frames.iter().map(|f| count(f, key)).sum::<u64>();
    assert_eq!(
        (
            sum("reasoning_events"),
            sum("content_events"),
            sum("tool_call_events")
        ),
        (6, 5, 6)
    );
    for f in &frames {
        let phases = count(f, "reasoning_events")
            + count(f, "content_events")
            + count(f, "tool_call_events");
        assert_eq!(phases, count(f, "events"), "{f}");
    }
    let paused: Vec<&Value> = frames
        .iter()
        .filter(|f| f.get("paused_us").is_some())
        .collect();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0]["paused_us"], 400_000);
    assert_eq!(
        paused[0]["event"], 6,
        "the frame whose first token event is the first answer token"
    );
    assert_eq!(
        count(paused[0], "reasoning_events"),
        0,
        "a step never mixes phases"
    );
}

/// The answers of requests that do not stream carry every phase in their API's shape.
#[tokio::test]
async fn whole_answers_carry_every_phase() {
    let sim = sim_with(SimConfig {
        gap: ms(1),
        ttft: ms(1),
        ..sim_agent()
    })
    .await;
    async fn whole(sim: &sim::SimHandle, path: &str, body: &str) -> Value {
        let got = request(sim.addr(), "POST", path, body, false).await;
        assert_eq!(got.status, 200, "{path}");
        serde_json::from_slice::<Value>(&got.bytes()).unwrap()
    }
    let r = whole(&sim, "/v1/responses", r#"{"input":"hi"}"#).await;
    let kinds: Vec<&str> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["reasoning", "message", "function_call", "function_call"]
    );
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 6);
    assert_eq!(r["usage"]["output_tokens"], 6 + 5 + 6);
    let o = whole(&sim, "/api/chat", r#"{"stream":false,"messages":[]}"#).await;
    assert!(o["message"]["thinking"]
        .as_str()
        .unwrap()
        .starts_with(" idea"));
    assert_eq!(o["message"]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(o["eval_count"], 6 + 5 + 6);
    let g = whole(
        &sim,
        "/v1beta/models/sim-model:generateContent",
        r#"{"contents":[]}"#,
    )
    .await;
    assert_eq!(g["candidates"][0]["content"]["parts"][0]["thought"], true);
    assert_eq!(g["usageMetadata"]["thoughtsTokenCount"], 6);
    let c = whole(&sim, "/v1/chat/completions", r#"{"messages":[]}"#).await;
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    assert!(c["choices"][0]["message"]["reasoning_content"].is_string());
    let no_sse = request(
        sim.addr(),
        "POST",
        "/v1beta/models/sim-model:streamGenerateContent",
        "{}",
        false,
    )
    .await;
    assert_eq!(no_sse.status, 400);
    let error: Value = serde_json::from_slice(&no_sse.bytes()).unwrap();
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("alt=sse"));
    sim.shutdown().await.unwrap();
}

/// Through the proxy as it is measured today: every phase's events are token events, so the
/// proxy counts R + C + T token events (R + C + N where calls come whole) and its TTFT is the
/// first reasoning event. The Responses stream uses `response.reasoning_text.delta`, which the
/// proxy already counts.
#[tokio::test]
async fn the_proxy_counts_every_phase_as_token_events() {
    const ITL: &str = "metronome_inter_token_latency_seconds_count";
    const TTFT_SUM: &str = "metronome_time_to_first_token_seconds_sum";
    let sim = sim_with(SimConfig {
        responses_reasoning: sim::ResponsesReasoning::Text,
        ..sim_agent()
    })
    .await;
    let formats = [
        "openai",
        "openai",
        "tgi",
        "anthropic",
        "responses",
        "ollama",
        "gemini",
    ];
    for (shape, format) in SHAPES.iter().zip(formats) {
        let proxy = proxy_to(sim.addr()).await;
        let body = shape.body;
        let got = request(proxy.proxy_addr, "POST", shape.path, body, false).await;
        assert_eq!(got.status, 200, "{}", shape.name);
        let events = token_events(&got, shape, false);
        let total: u64 = expected_runs(shape, 6, 5, 2, 3)
            .iter()
            .map(|(_, n)| n)
            .sum();
        assert_eq!(events.len() as u64, total, "{}", shape.name);
        let m = scrape_until(&proxy, |m| m.get("metronome_streams_total", &[]).is_some()).await;
        assert_eq!(
            m.value("metronome_stream_format_total", &[("format", format)]),
            1.0,
            "{}",
            shape.name
        );
        let ingress = [("point", "ingress")];
        assert_eq!(m.value(ITL, &ingress), (total - 1) as f64, "{}", shape.name);
        let ttft = m.value(TTFT_SUM, &ingress);
        assert!(
            (0.015..0.4).contains(&ttft),
            "{}: TTFT {ttft} s is the first reasoning event, before the 400 ms pause",
            shape.name
        );
        proxy.shutdown().await;
    }
    sim.shutdown().await.unwrap();
}

/// Kills the child process when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The flags reach the streams: `metronome sim` started as a user starts it.
#[tokio::test]
async fn the_command_line_sets_the_phases() {
    use std::io::BufRead;
    const BIN: &str = env!("CARGO_BIN_EXE_metronome");
    let help = std::process::Command::new(BIN)
        .args(["sim", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for flag in [
        "--reasoning-tokens",
        "--think-pause",
        "--tool-calls",
        "--tool-call-tokens",
        "--think-tags",
        "--reasoning-field",
        "--responses-reasoning",
    ] {
        assert!(help.contains(flag), "sim --help documents {flag}");
    }
    let mut child = KillOnDrop(
        std::process::Command::new(BIN)
            .args([
                "sim",
                "--listen",
                "127.0.0.1:0",
                "--gap",
                "5ms",
                "--ttft",
                "10ms",
            ])
            .args([
                "--tokens",
                "4",
                "--reasoning-tokens",
                "3",
                "--think-pause",
                "300ms",
            ])
            .args([
                "--tool-calls",
                "1",
                "--tool-call-tokens",
                "2",
                "--think-tags",
                "inline",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    let stdout = child.0.stdout.take().unwrap();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .rsplit("http://")
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {line}"));
    let got = request(addr, "POST", CHAT.path, CHAT.body, false).await;
    let events = token_events(&got, &CHAT, false);
    assert_eq!(
        runs(&events),
        [
            (Phase::Reasoning, 3),
            (Phase::Content, 4),
            (Phase::ToolCall, 2)
        ]
    );
    assert_eq!(events[0].2, "<think>");
    assert_eq!(events[2].2, "</think>");
    assert_the_pause_is_the_one_long_gap(&events, "the sim started from the command line");
}
