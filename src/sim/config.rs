//! What the sim serves and at what cadence, as plain data: built from the command line
//! ([`super::SimArgs`]) or in code by the demo and by tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::replay::Replay;

/// When the OpenAI shapes send the final `usage` chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageMode {
    /// Every stream ends with a usage chunk, as if each request asked for it; the default, so
    /// a proxy always sees the server's own token count.
    Always,
    /// Only when the request sets `stream_options.include_usage: true`, as vLLM and OpenAI do.
    Request,
    /// Never, to exercise a proxy that has to count token events itself.
    Never,
}

/// Who sets the time of a stream's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Engine {
    /// Each stream has its own cadence (`--gap`, `--jitter`, `--contention-k`, ...).
    #[default]
    Stream,
    /// One decode loop for the whole server, as continuous batching runs it: every step gives
    /// each decoding stream one token, and a new request's prefill holds the step.
    Batch,
}

/// How a stream carries its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ThinkTags {
    /// In the API's own reasoning field or block (`reasoning_content`, `thinking_delta`, a
    /// `thought` part …), as a server with a reasoning parser sends it. The APIs that have no such
    /// field (completions, TGI's native stream) carry it inline, as `inline` does.
    #[default]
    Parser,
    /// Inside the text, between `<think>` and `</think>`, each tag a token event of its own: a
    /// model served without a reasoning parser.
    Inline,
    /// Inside the text, ending with `</think>` but with no opening tag: a chat template that
    /// opens the thinking in the prompt.
    OpenInPrompt,
}

/// Which delta field OpenAI-compatible chat chunks carry the reasoning in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReasoningField {
    /// `delta.reasoning_content`, as vLLM's reasoning parsers, SGLang and DeepSeek send it.
    #[default]
    ReasoningContent,
    /// `delta.reasoning`, the newer vLLM name (and OpenRouter's, llama.cpp's and Ollama's `/v1`).
    Reasoning,
    /// Both fields with the same text, as vLLM versions that kept the old name alongside do.
    Both,
}

/// Which Responses API events carry the reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResponsesReasoning {
    /// `response.reasoning_summary_text.delta`: OpenAI's reasoning models asked for a summary.
    #[default]
    Summary,
    /// `response.reasoning_text.delta`: open-weight models served by vLLM (gpt-oss).
    Text,
}

/// How the WebSocket endpoints (the Responses API's WebSocket mode, the Realtime API) frame what
/// they send, and how they end a socket: what a test of a tunnel needs to vary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSocketConfig {
    /// Accept `permessage-deflate` when the client offers it (no context takeover is honoured
    /// as the client asks).
    pub deflate: bool,
    /// Split messages longer than this many bytes into fragments of at most this many
    /// (`None`: every message in one frame).
    pub fragment: Option<usize>,
    /// Send a ping this often (`None`: only answer the client's pings).
    pub ping: Option<Duration>,
    /// Close each socket with this code and reason once it has served `close_after` responses
    /// (`None`: the client closes).
    pub close: Option<CloseSpec>,
    /// Responses a socket serves before the server closes it with `close`.
    pub close_after: u64,
    /// Realtime API: the audio a spoken token lasts (24 kHz 16-bit mono, 48 bytes a
    /// millisecond), sent base64 in its `response.output_audio.delta`.
    pub audio_per_token: Duration,
}

/// A close frame the server sends: its code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseSpec {
    /// The status code (1000, 1001, 1008, 3000–4999, ...).
    pub code: u16,
    /// The reason, at most 123 bytes of UTF-8.
    pub reason: String,
}

/// Bytes of 24 kHz 16-bit mono audio per millisecond.
const AUDIO_BYTES_PER_MS: u128 = 48;

// === impl WebSocketConfig ===

impl Default for WebSocketConfig {
    fn default() -> Self {
        WebSocketConfig {
            deflate: true,
            fragment: None,
            ping: None,
            close: None,
            close_after: 1,
            audio_per_token: Duration::from_millis(50),
        }
    }
}

impl WebSocketConfig {
    /// Audio bytes per spoken token: `audio_per_token` of 24 kHz PCM16, cut to a multiple of 6
    /// (whole samples, and whole base64 quanta, so tokens' audio joins without padding).
    pub fn audio_bytes_per_token(&self) -> usize {
        let bytes = self.audio_per_token.as_micros() * AUDIO_BYTES_PER_MS / 1000;
        usize::try_from(bytes - bytes % 6).unwrap_or(usize::MAX)
    }

    /// Checks the values a caller could set out of range, naming the command-line flag.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.fragment == Some(0) {
            return Err(ConfigError::new("--ws-fragment", "must be at least 1"));
        }
        if self.close_after == 0 {
            return Err(ConfigError::new("--ws-close-after", "must be at least 1"));
        }
        if self.ping.is_some_and(|p| p.is_zero()) {
            return Err(ConfigError::new("--ws-ping", "must be longer than 0"));
        }
        if let Some(close) = &self.close {
            close.validate()?;
        }
        let bytes = self.audio_bytes_per_token();
        if bytes == 0 || bytes > 1 << 20 {
            return Err(ConfigError::new(
                "--audio-per-token",
                "must be between 125us and about 21s",
            ));
        }
        Ok(())
    }
}

// === impl CloseSpec ===

impl CloseSpec {
    /// Parses `CODE` or `CODE:REASON` (`4000:done`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (code, reason) = text.split_once(':').unwrap_or((text, ""));
        let code = code
            .trim()
            .parse()
            .map_err(|_| format!("`{code}` is not a close code (write e.g. 4000:done)"))?;
        let spec = CloseSpec {
            code,
            reason: reason.to_owned(),
        };
        spec.validate().map_err(|e| e.reason)?;
        Ok(spec)
    }

    /// A code an endpoint may send (RFC 6455 section 7.4) and a reason that fits a control frame.
    fn validate(&self) -> Result<(), ConfigError> {
        let sendable = matches!(self.code, 1000..=1003 | 1007..=1014 | 3000..=4999);
        if !sendable {
            return Err(ConfigError::new(
                "--ws-close",
                format!(
                    "code {} cannot be sent in a close frame (1000-1003, 1007-1014, 3000-4999)",
                    self.code
                ),
            ));
        }
        if self.reason.len() > 123 {
            return Err(ConfigError::new(
                "--ws-close",
                "reason must be at most 123 bytes",
            ));
        }
        Ok(())
    }
}

/// Everything the sim needs to answer requests: output length, wire details and the cadence
/// model. The fields are public so a caller can write
/// `SimConfig { gap: Duration::from_millis(20), tokens: 40, ..SimConfig::default() }`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The model name reported in chunks and by `GET /v1/models`.
    pub model: String,
    /// Seeds every random choice (gaps, stalls, accepted tokens, words), so a run repeats.
    pub seed: u64,
    /// Output tokens when the request does not say (`max_tokens` and kin).
    pub tokens: u64,
    /// Upper bound on the output tokens of one request, whatever it asks for.
    pub max_tokens_cap: u64,
    /// When the OpenAI shapes add a usage chunk.
    pub usage: UsageMode,
    /// Median time between decode steps (token events).
    pub gap: Duration,
    /// Shape (sigma) of the log-normal gap distribution; 0 keeps every gap equal to `gap`.
    pub jitter: f64,
    /// Probability that a decode step is preceded by a stall of length `stall`.
    pub stall_prob: f64,
    /// Length of a stall, random (`stall_prob`) or placed (`stall_at`).
    pub stall: Duration,
    /// Token events (1-based) of every stream that are preceded by a stall: exact, for tests.
    pub stall_at: Vec<u64>,
    /// Continuous-batching cost: each decode step takes `gap + contention_k × active streams`.
    pub contention_k: Duration,
    /// Speculative decoding: draft tokens proposed per step (0 disables it).
    pub spec_k: u32,
    /// Probability that each draft token is accepted.
    pub spec_accept: f64,
    /// Decode steps written together in one frame (1 writes each as soon as it is ready).
    pub coalesce: u32,
    /// A buffering edge in front of the server: hold output until this many bytes are pending.
    pub edge_flush_bytes: Option<usize>,
    /// A buffering edge in front of the server: flush pending output this long after the last flush.
    pub edge_flush_interval: Option<Duration>,
    /// Time to first token before any prompt cost (the prefill floor).
    pub ttft: Duration,
    /// Extra time to first token per prompt token (prompt tokens ≈ prompt bytes / 4).
    pub ttft_per_prompt_token: Duration,
    /// Reasoning tokens streamed before the answer (0: none). A request may set its own
    /// (`sim_reasoning_tokens`) or cap them as each API does (`thinking_token_budget` …).
    pub reasoning_tokens: u64,
    /// Extra time between the last reasoning token and the first answer token.
    pub think_pause: Duration,
    /// Tool calls streamed after the answer, in the APIs that have them.
    pub tool_calls: u64,
    /// Argument tokens of each tool call.
    pub tool_call_tokens: u64,
    /// How the reasoning travels: in its own field, or inline between think tags.
    pub think_tags: ThinkTags,
    /// OpenAI-compatible chat: the delta field of the reasoning.
    pub reasoning_field: ReasoningField,
    /// Responses API: the events of the reasoning.
    pub responses_reasoning: ResponsesReasoning,
    /// Who sets the time of tokens: each stream, or one shared decode loop (`--engine batch`).
    pub engine: Engine,
    /// `--engine batch`: what each prompt token prefilled in a step adds to that step.
    pub prefill_per_token: Duration,
    /// `--engine batch`: most prompt tokens prefilled in one step (0: the whole prompt at once).
    pub prefill_chunk: u64,
    /// Where to write the JSON-lines timeline of every frame's send time, if anywhere.
    pub timeline: Option<PathBuf>,
    /// How long a shutdown waits for streams in flight before it closes them.
    pub drain: Duration,
    /// A captured timeline to play back for every streamed request instead of generating
    /// (`--replay`); the cadence fields above are then unused for streams.
    pub replay: Option<Arc<Replay>>,
    /// The WebSocket endpoints' framing and closing.
    pub websocket: WebSocketConfig,
}

// === impl SimConfig ===

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim-model".to_owned(),
            seed: 0,
            tokens: 64,
            max_tokens_cap: 4096,
            usage: UsageMode::Always,
            gap: Duration::from_millis(50),
            jitter: 0.0,
            stall_prob: 0.0,
            stall: Duration::from_millis(300),
            stall_at: Vec::new(),
            contention_k: Duration::ZERO,
            spec_k: 0,
            spec_accept: 0.7,
            coalesce: 1,
            edge_flush_bytes: None,
            edge_flush_interval: None,
            ttft: Duration::from_millis(100),
            ttft_per_prompt_token: Duration::ZERO,
            reasoning_tokens: 0,
            think_pause: Duration::ZERO,
            tool_calls: 0,
            tool_call_tokens: 8,
            think_tags: ThinkTags::Parser,
            reasoning_field: ReasoningField::ReasoningContent,
            responses_reasoning: ResponsesReasoning::Summary,
            engine: Engine::Stream,
            prefill_per_token: Duration::from_micros(100),
            prefill_chunk: 0,
            timeline: None,
            drain: Duration::from_secs(10),
            replay: None,
            websocket: WebSocketConfig::default(),
        }
    }
}

impl SimConfig {
    /// The demo's upstream: a busy server whose stutter is visible in a short run (jittered gaps,
    /// slowdown under concurrency and the occasional stall).
    pub fn demo_contention() -> Self {
        SimConfig {
            gap: Duration::from_millis(40),
            jitter: 0.25,
            contention_k: Duration::from_millis(1),
            stall_prob: 0.01,
            stall: Duration::from_millis(350),
            ..SimConfig::default()
        }
    }

    /// Checks the values a caller could set out of range, naming the command-line flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.jitter.is_finite() && self.jitter >= 0.0) {
            return Err(ConfigError::new("--jitter", "must be a number >= 0"));
        }
        if !(0.0..=1.0).contains(&self.stall_prob) {
            return Err(ConfigError::new("--stall-prob", "must be between 0 and 1"));
        }
        if !(0.0..=1.0).contains(&self.spec_accept) {
            return Err(ConfigError::new("--spec-accept", "must be between 0 and 1"));
        }
        if self.tokens == 0 {
            return Err(ConfigError::new("--tokens", "must be at least 1"));
        }
        if self.max_tokens_cap == 0 {
            return Err(ConfigError::new("--max-tokens-cap", "must be at least 1"));
        }
        if self.tool_call_tokens == 0 {
            return Err(ConfigError::new("--tool-call-tokens", "must be at least 1"));
        }
        if self.coalesce == 0 {
            return Err(ConfigError::new("--coalesce", "must be at least 1"));
        }
        if self.stall_at.contains(&0) {
            return Err(ConfigError::new(
                "--stall-at",
                "counts token events from 1, so 0 is not one",
            ));
        }
        if self.edge_flush_bytes == Some(0) {
            return Err(ConfigError::new("--edge-flush-bytes", "must be at least 1"));
        }
        if self.model.is_empty() {
            return Err(ConfigError::new("--model", "must not be empty"));
        }
        self.websocket.validate()
    }
}

/// A configuration value out of range; the message names the flag to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {reason}.")]
pub struct ConfigError {
    /// The command-line flag at fault, e.g. `--jitter`.
    pub flag: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

// === impl ConfigError ===

impl ConfigError {
    /// An error about `flag`.
    pub fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            flag,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        assert_eq!(SimConfig::default().validate(), Ok(()));
        let demo = SimConfig::demo_contention();
        assert_eq!(demo.validate(), Ok(()));
        assert!(demo.jitter > 0.0 && demo.stall_prob > 0.0 && !demo.contention_k.is_zero());
    }

    #[test]
    fn close_specs_and_audio_sizes() {
        let spec = CloseSpec::parse("4000:all done").unwrap();
        assert_eq!((spec.code, spec.reason.as_str()), (4000, "all done"));
        assert_eq!(CloseSpec::parse("1001").unwrap().reason, "");
        assert!(CloseSpec::parse("1005:x")
            .unwrap_err()
            .contains("cannot be sent"));
        assert!(CloseSpec::parse("abc").is_err());
        let ws = WebSocketConfig::default();
        assert_eq!(ws.audio_bytes_per_token(), 2400);
        let odd = WebSocketConfig {
            audio_per_token: Duration::from_micros(1100),
            ..WebSocketConfig::default()
        };
        assert_eq!(odd.audio_bytes_per_token() % 6, 0);
        let config = SimConfig {
            websocket: WebSocketConfig {
                fragment: Some(0),
                ..WebSocketConfig::default()
            },
            ..SimConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().flag, "--ws-fragment");
    }

    #[test]
    fn errors_read_as_sentences_naming_the_flag() {
        let config = SimConfig {
            stall_prob: 1.5,
            ..SimConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(err.flag, "--stall-prob");
        assert_eq!(err.to_string(), "--stall-prob must be between 0 and 1.");
    }
}
