//! The recorded-shape streams of tests/fixtures/ and what metronome must make of each: the table
//! that tests/it/formats.rs replays through the proxy and tests/it/transparency.rs cuts at random.
//! Where each shape comes from is in tests/fixtures/README.md.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;

use super::Step;

/// One fixture and the figures the proxy must report for it.
#[derive(Debug, Clone, Copy)]
pub struct Fixture {
    /// File name under tests/fixtures/.
    pub file: &'static str,
    /// The response's content type.
    pub content_type: &'static str,
    /// The request path (with query) the client uses.
    pub path: &'static str,
    /// A piece of text inside the first token event, to place a delay before that event.
    pub first_token: &'static str,
    /// Token events.
    pub token_events: u64,
    /// Output tokens and their source (`usage` or `counted`).
    pub tokens: (u64, &'static str),
    /// Sum of `metronome_tokens_per_event` (the exact per-event counts, 1 where unknown).
    pub tokens_per_event_sum: u64,
    /// `metronome_streams_total{outcome}`.
    pub outcome: &'static str,
    /// The `model` label.
    pub model: &'static str,
    /// `metronome_stream_format_total{format}`.
    pub format: &'static str,
    /// `metronome_streams_total{finish_reason}`.
    pub finish_reason: &'static str,
    /// The input tokens the stream's usage reports, if it does.
    pub prompt_tokens: Option<u64>,
}

const SSE: &str = "text/event-stream";
const NDJSON: &str = "application/x-ndjson";

/// Every fixture.
pub const FIXTURES: &[Fixture] = &[
    Fixture {
        file: "openai_chat_crlf_e2e.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":" Metro""#,
        token_events: 40,
        tokens: (40, "usage"),
        tokens_per_event_sum: 40,
        outcome: "complete",
        model: "meta-llama/Llama-3.1-8B-Instruct",
        format: "openai",
        finish_reason: "stop",
        prompt_tokens: Some(12),
    },
    Fixture {
        file: "openai_chat_vllm.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":"The""#,
        token_events: 8,
        tokens: (11, "usage"),
        tokens_per_event_sum: 8,
        outcome: "complete",
        model: "meta-llama/Llama-3.1-8B-Instruct",
        format: "openai",
        finish_reason: "stop",
        prompt_tokens: Some(42),
    },
    Fixture {
        file: "openai_continuous_usage.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":"Speculative""#,
        token_events: 8,
        tokens: (19, "usage"),
        tokens_per_event_sum: 18,
        outcome: "complete",
        model: "meta-llama/Llama-3.1-8B-Instruct",
        format: "openai",
        finish_reason: "stop",
        prompt_tokens: Some(17),
    },
    Fixture {
        file: "openai_completions_n2.sse",
        content_type: SSE,
        path: "/v1/completions",
        first_token: r#""text":" red""#,
        token_events: 12,
        tokens: (12, "usage"),
        tokens_per_event_sum: 12,
        outcome: "complete",
        model: "Qwen/Qwen2.5-7B-Instruct",
        format: "openai",
        finish_reason: "stop",
        prompt_tokens: Some(6),
    },
    Fixture {
        file: "openai_token_ids.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":"Hi""#,
        token_events: 3,
        tokens: (6, "counted"),
        tokens_per_event_sum: 4,
        outcome: "complete",
        model: "meta-llama/Llama-3.1-8B-Instruct",
        format: "openai",
        finish_reason: "stop",
        prompt_tokens: None,
    },
    Fixture {
        file: "openai_error_midstream.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":"Once""#,
        token_events: 3,
        tokens: (3, "counted"),
        tokens_per_event_sum: 3,
        outcome: "upstream_error",
        model: "meta-llama/Llama-3.1-8B-Instruct",
        format: "openai",
        finish_reason: "error",
        prompt_tokens: None,
    },
    Fixture {
        file: "tgi_v1_chat.sse",
        content_type: SSE,
        path: "/v1/chat/completions",
        first_token: r#""content":"Deep""#,
        token_events: 8,
        tokens: (9, "usage"),
        tokens_per_event_sum: 8,
        outcome: "complete",
        model: "mistralai/Mistral-7B-Instruct-v0.3",
        format: "openai",
        finish_reason: "length",
        prompt_tokens: Some(12),
    },
    Fixture {
        file: "tgi_generate_stream.sse",
        content_type: SSE,
        path: "/generate_stream",
        first_token: r#""index":1,"#,
        token_events: 8,
        tokens: (9, "usage"),
        tokens_per_event_sum: 8,
        outcome: "complete",
        model: "unknown",
        format: "tgi",
        finish_reason: "stop",
        prompt_tokens: None,
    },
    Fixture {
        file: "tgi_error.sse",
        content_type: SSE,
        path: "/generate_stream",
        first_token: r#""index":1,"#,
        token_events: 3,
        tokens: (3, "counted"),
        tokens_per_event_sum: 3,
        outcome: "upstream_error",
        model: "unknown",
        format: "tgi",
        finish_reason: "error",
        prompt_tokens: None,
    },
    Fixture {
        file: "llamacpp_completion.sse",
        content_type: SSE,
        path: "/completion",
        first_token: r#""content":" Paris""#,
        token_events: 8,
        tokens: (11, "usage"),
        tokens_per_event_sum: 10,
        outcome: "complete",
        model: "qwen2.5-7b-instruct",
        format: "llamacpp",
        finish_reason: "stop",
        prompt_tokens: Some(6),
    },
    Fixture {
        file: "llamacpp_legacy_error.sse",
        content_type: SSE,
        path: "/completion",
        first_token: r#""content":" Hello""#,
        token_events: 3,
        tokens: (3, "counted"),
        tokens_per_event_sum: 3,
        outcome: "upstream_error",
        model: "unknown",
        format: "llamacpp",
        finish_reason: "error",
        prompt_tokens: None,
    },
    Fixture {
        file: "sglang_generate.sse",
        content_type: SSE,
        path: "/generate",
        first_token: r#""text":" Paris","#,
        token_events: 9,
        tokens: (12, "usage"),
        tokens_per_event_sum: 12,
        outcome: "complete",
        model: "unknown",
        format: "sglang",
        finish_reason: "stop",
        prompt_tokens: Some(7),
    },
    Fixture {
        file: "ollama_chat.ndjson",
        content_type: NDJSON,
        path: "/api/chat",
        first_token: r#""content":"The""#,
        token_events: 9,
        tokens: (10, "usage"),
        tokens_per_event_sum: 9,
        outcome: "complete",
        model: "llama3.2",
        format: "ollama",
        finish_reason: "stop",
        prompt_tokens: Some(31),
    },
    Fixture {
        file: "ollama_generate.ndjson",
        content_type: NDJSON,
        path: "/api/generate",
        first_token: r#""response":"def""#,
        token_events: 11,
        tokens: (12, "usage"),
        tokens_per_event_sum: 11,
        outcome: "complete",
        model: "qwen2.5-coder:7b",
        format: "ollama",
        finish_reason: "stop",
        prompt_tokens: Some(36),
    },
    Fixture {
        file: "responses.sse",
        content_type: SSE,
        path: "/v1/responses",
        first_token: r#""delta":"Ocean""#,
        token_events: 7,
        tokens: (72, "usage"),
        tokens_per_event_sum: 7,
        outcome: "complete",
        model: "o4-mini-2025-04-16",
        format: "responses",
        finish_reason: "stop",
        prompt_tokens: Some(14),
    },
    Fixture {
        file: "anthropic_messages.sse",
        content_type: SSE,
        path: "/v1/messages",
        first_token: r#""text":"Okay""#,
        token_events: 9,
        tokens: (89, "usage"),
        tokens_per_event_sum: 9,
        outcome: "complete",
        model: "claude-sonnet-4-5-20250929",
        format: "anthropic",
        finish_reason: "tool_calls",
        prompt_tokens: Some(472),
    },
    Fixture {
        file: "anthropic_overloaded.sse",
        content_type: SSE,
        path: "/v1/messages",
        first_token: r#""text":"Hello""#,
        token_events: 2,
        tokens: (2, "counted"),
        tokens_per_event_sum: 2,
        outcome: "upstream_error",
        model: "claude-sonnet-4-5-20250929",
        format: "anthropic",
        finish_reason: "error",
        prompt_tokens: Some(25),
    },
    Fixture {
        file: "gemini_stream.sse",
        content_type: SSE,
        path: "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
        first_token: r#""text": "The""#,
        token_events: 4,
        tokens: (31, "usage"),
        tokens_per_event_sum: 32,
        outcome: "complete",
        model: "gemini-2.0-flash",
        format: "gemini",
        finish_reason: "stop",
        prompt_tokens: Some(9),
    },
    Fixture {
        file: "unknown_plain.sse",
        content_type: SSE,
        path: "/stream",
        first_token: "data: Hello",
        token_events: 4,
        tokens: (4, "counted"),
        tokens_per_event_sum: 4,
        outcome: "complete",
        model: "unknown",
        format: "unknown",
        finish_reason: "none",
        prompt_tokens: None,
    },
];

// === impl Fixture ===

impl Fixture {
    /// The fixture named `file`.
    pub fn named(file: &str) -> &'static Fixture {
        FIXTURES
            .iter()
            .find(|f| f.file == file)
            .unwrap_or_else(|| panic!("no fixture {file}"))
    }

    /// The fixture's bytes, exactly as on disk.
    pub fn bytes(&self) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(self.file);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Where the event holding the first token starts: just after the blank line (SSE) or line
    /// end (NDJSON) before `first_token`. Found from the text alone, not by metronome's parser.
    pub fn first_token_offset(&self, body: &[u8]) -> usize {
        let at = find(body, self.first_token.as_bytes())
            .unwrap_or_else(|| panic!("{}: no {:?}", self.file, self.first_token));
        let before = &body[..at];
        let boundaries: &[&[u8]] = if self.content_type == NDJSON {
            &[b"\n"]
        } else {
            &[b"\n\n", b"\r\n\r\n", b"\r\r"]
        };
        boundaries
            .iter()
            .filter_map(|b| rfind(before, b).map(|i| i + b.len()))
            .max()
            .unwrap_or(0)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// Cuts `body` into frames at `cuts` (out-of-range and repeated cuts ignored); the frame that
/// starts at `delay_at` waits `delay`, the others wait what `wait` says for their index.
pub fn frames(
    body: &[u8],
    mut cuts: Vec<usize>,
    delay_at: usize,
    delay: Duration,
    wait: impl Fn(usize) -> Duration,
) -> Vec<Step> {
    cuts.push(delay_at);
    cuts.retain(|c| *c > 0 && *c < body.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut steps = Vec::new();
    let mut start = 0;
    for (i, end) in cuts
        .into_iter()
        .chain(std::iter::once(body.len()))
        .enumerate()
    {
        let pause = if start == delay_at { delay } else { wait(i) };
        steps.push(Step::Frame(
            pause,
            Bytes::copy_from_slice(&body[start..end]),
        ));
        start = end;
    }
    steps
}
