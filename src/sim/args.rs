//! The command line of `metronome sim`. Durations go through [`crate::units::parse_duration`],
//! so clap rejects a bad one naming its flag; ranges are checked by [`SimConfig::validate`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::config::{
    CloseSpec, ConfigError, Engine, ReasoningField, ResponsesReasoning, SimConfig, ThinkTags,
    UsageMode, WebSocketConfig,
};
use super::replay::Replay;
use crate::units::parse_duration;

/// Command-line arguments of `metronome sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,

    /// Model name reported in responses and by GET /v1/models.
    #[arg(long, default_value = "sim-model")]
    pub model: String,

    /// Seed of every random choice, so a run repeats.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Output tokens when the request does not set max_tokens.
    #[arg(long, default_value_t = 64)]
    pub tokens: u64,

    /// Most output tokens one request may get, whatever it asks for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_cap: u64,

    /// When OpenAI-shaped streams end with a usage chunk.
    #[arg(long, value_enum, default_value_t = UsageMode::Always)]
    pub usage: UsageMode,

    /// Write the send time of every frame as JSON lines to this file.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,

    /// How long shutdown waits for streams in flight.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain: Duration,

    /// Replay a captured stream timeline (the JSON of metronome's /streams/{id}) for every
    /// streamed request: each frame at its ingress offset, with its events, token events and size,
    /// as an OpenAI chat stream. The cadence flags are then ignored for streams.
    #[arg(long, value_name = "TIMELINE.json")]
    pub replay: Option<PathBuf>,

    /// The cadence model (boxed: it is most of the flags, and the subcommand enum stays small).
    #[command(flatten)]
    pub cadence: Box<CadenceArgs>,

    /// What each stream outputs besides the answer: reasoning, a think pause, tool calls.
    #[command(flatten)]
    pub phases: Box<PhaseArgs>,

    /// The WebSocket endpoints' framing and closing.
    #[command(flatten)]
    pub websocket: Box<WebSocketArgs>,
}

/// Whether the WebSocket endpoints accept `permessage-deflate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Deflate {
    /// Accept it when the client offers it.
    Allow,
    /// Never: every message goes uncompressed, whatever the client offers.
    Deny,
}

/// The flags of the WebSocket endpoints: `GET /v1/responses` (the Responses API's WebSocket
/// mode) and `GET /v1/realtime` (the Realtime API), upgraded.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "WebSocket (GET /v1/responses and /v1/realtime, upgraded)")]
pub struct WebSocketArgs {
    /// Accept permessage-deflate when the client offers it, or never.
    #[arg(long, value_enum, default_value_t = Deflate::Allow)]
    pub ws_deflate: Deflate,

    /// Split messages longer than N bytes into fragments of at most N bytes.
    #[arg(long, value_name = "N")]
    pub ws_fragment: Option<usize>,

    /// Send a ping this often (e.g. 1s); the client's pings are always answered.
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub ws_ping: Option<Duration>,

    /// Close each socket with this code and reason, `CODE` or `CODE:REASON` (e.g. 4000:done),
    /// once it has served --ws-close-after responses. Without it the client closes.
    #[arg(long, value_parser = CloseSpec::parse, value_name = "CODE[:REASON]")]
    pub ws_close: Option<CloseSpec>,

    /// With --ws-close: responses a socket serves before the server closes it.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "ws_close")]
    pub ws_close_after: u64,

    /// Realtime API: how long the audio of one spoken token lasts (24 kHz 16-bit mono, sent
    /// base64 in each response.output_audio.delta).
    #[arg(long, default_value = "50ms", value_parser = parse_duration, value_name = "T")]
    pub audio_per_token: Duration,
}

/// The flags that give every stream the phases of a reasoning model or an agent: thinking, a
/// pause, the answer, tool calls. A request body may override each with a `sim_` field.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Reasoning and tool calls")]
pub struct PhaseArgs {
    /// Reasoning tokens before the answer, one token event each (0 = none). A request's
    /// `sim_reasoning_tokens` sets its own; `thinking_token_budget` (vLLM),
    /// `chat_template_kwargs.enable_thinking: false`, Anthropic's `thinking`, Ollama's
    /// `think: false`, Gemini's `thinkingBudget` and Responses' `reasoning.effort: "none"` cap
    /// or switch them off as those servers do.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub reasoning_tokens: u64,

    /// Extra time between the last reasoning token and the first answer token (e.g. 500ms;
    /// a request's `sim_think_pause_ms`).
    #[arg(long, default_value = "0ms", value_parser = parse_duration, value_name = "T")]
    pub think_pause: Duration,

    /// Tool calls after the answer, in the APIs that have them (chat, Anthropic, Responses,
    /// Ollama, Gemini); a request's `sim_tool_calls`.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub tool_calls: u64,

    /// Argument tokens of each tool call: one token event each where the API streams arguments,
    /// one event per call where it sends a call whole (Ollama, Gemini); a request's
    /// `sim_tool_call_tokens`.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub tool_call_tokens: u64,

    /// How the reasoning travels; a request's `sim_think_tags`.
    #[arg(long, value_enum, default_value_t = ThinkTags::Parser)]
    pub think_tags: ThinkTags,

    /// OpenAI chat: the delta field of the reasoning; a request's `sim_reasoning_field`.
    #[arg(long, value_enum, default_value_t = ReasoningField::ReasoningContent)]
    pub reasoning_field: ReasoningField,

    /// Responses API: the events of the reasoning; a request's `sim_responses_reasoning`.
    #[arg(long, value_enum, default_value_t = ResponsesReasoning::Summary)]
    pub responses_reasoning: ResponsesReasoning,
}

/// The flags that shape the cadence of every stream: gaps, stalls, contention, speculative
/// decoding, coalescing, a buffering edge and the time to first token.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Cadence")]
pub struct CadenceArgs {
    /// Median gap between token events (e.g. 50ms).
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub gap: Duration,

    /// Sigma of log-normal gaps around --gap (0 = steady).
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,

    /// Probability of a stall before each token event.
    #[arg(long, default_value_t = 0.0)]
    pub stall_prob: f64,

    /// Length of a stall (random or --stall-at).
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub stall: Duration,

    /// Stall before token event N (1-based) of every stream; repeatable. A request's own
    /// `sim_stall_at: N` stalls that stream alone.
    #[arg(long = "stall-at", value_name = "N")]
    pub stall_at: Vec<u64>,

    /// Continuous batching: each decode step takes gap + K x active streams (e.g. 2ms).
    #[arg(long, default_value = "0ms", value_parser = parse_duration, value_name = "K")]
    pub contention_k: Duration,

    /// Speculative decoding: draft tokens per step (0 = off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub spec_k: u32,

    /// Speculative decoding: acceptance probability of each draft token.
    #[arg(long, default_value_t = 0.7, value_name = "A")]
    pub spec_accept: f64,

    /// Token events written together in one frame.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub coalesce: u32,

    /// Buffering edge: flush only when this many bytes are pending.
    #[arg(long, value_name = "N")]
    pub edge_flush_bytes: Option<usize>,

    /// Buffering edge: flush pending output this long after the last flush (e.g. 100ms).
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub edge_flush_ms: Option<Duration>,

    /// Time to first token before any prompt cost.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub ttft: Duration,

    /// Extra time to first token per prompt token (prompt tokens = prompt bytes / 4).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pub ttft_per_prompt_token: Duration,

    /// Who sets the time of tokens: each stream (`stream`), or one decode loop for the whole
    /// server (`batch`: each step gives every decoding stream one token after --gap, and a new
    /// request's prefill holds the step; --ttft, --jitter, --contention-k and --spec-k are then
    /// unused for streams).
    #[arg(long, value_enum, default_value_t = Engine::Stream)]
    pub engine: Engine,

    /// --engine batch: what each prompt token adds to the step that prefills it (e.g. 100us).
    /// Prompt tokens are the request's `sim_prompt_tokens` if set, else prompt bytes / 4.
    #[arg(long, default_value = "100us", value_parser = parse_duration, value_name = "T")]
    pub prefill_per_token: Duration,

    /// --engine batch: most prompt tokens prefilled in one step (0 = the whole prompt at once),
    /// as vLLM's chunked prefill spreads a long prompt over several steps.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub prefill_chunk: u64,
}

// === impl SimConfig ===

impl TryFrom<&SimArgs> for SimConfig {
    type Error = ConfigError;

    fn try_from(args: &SimArgs) -> Result<Self, Self::Error> {
        let cadence = &args.cadence;
        let phases = &args.phases;
        let ws = &args.websocket;
        let replay = match &args.replay {
            Some(path) => Some(Arc::new(
                Replay::load(path, &args.model).map_err(|e| ConfigError::new("--replay", e.0))?,
            )),
            None => None,
        };
        let config = SimConfig {
            model: args.model.clone(),
            seed: args.seed,
            tokens: args.tokens,
            max_tokens_cap: args.max_tokens_cap,
            usage: args.usage,
            gap: cadence.gap,
            jitter: cadence.jitter,
            stall_prob: cadence.stall_prob,
            stall: cadence.stall,
            stall_at: cadence.stall_at.clone(),
            contention_k: cadence.contention_k,
            spec_k: cadence.spec_k,
            spec_accept: cadence.spec_accept,
            coalesce: cadence.coalesce,
            edge_flush_bytes: cadence.edge_flush_bytes,
            edge_flush_interval: cadence.edge_flush_ms,
            ttft: cadence.ttft,
            ttft_per_prompt_token: cadence.ttft_per_prompt_token,
            reasoning_tokens: phases.reasoning_tokens,
            think_pause: phases.think_pause,
            tool_calls: phases.tool_calls,
            tool_call_tokens: phases.tool_call_tokens,
            think_tags: phases.think_tags,
            reasoning_field: phases.reasoning_field,
            responses_reasoning: phases.responses_reasoning,
            engine: cadence.engine,
            prefill_per_token: cadence.prefill_per_token,
            prefill_chunk: cadence.prefill_chunk,
            timeline: args.timeline.clone(),
            drain: args.drain,
            replay,
            websocket: WebSocketConfig {
                deflate: ws.ws_deflate == Deflate::Allow,
                fragment: ws.ws_fragment,
                ping: ws.ws_ping,
                close: ws.ws_close.clone(),
                close_after: ws.ws_close_after,
                audio_per_token: ws.audio_per_token,
            },
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn parse(args: &[&str]) -> Result<SimArgs, clap::Error> {
        let mut all = vec!["sim"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|c| c.sim)
    }

    #[test]
    fn defaults_match_sim_config_default() {
        let args = parse(&[]).unwrap();
        let config = SimConfig::try_from(&args).unwrap();
        assert_eq!(config, SimConfig::default());
    }

    #[test]
    fn flags_are_parsed() {
        let args = parse(&[
            "--gap",
            "30ms",
            "--stall-at",
            "5",
            "--stall-at",
            "9",
            "--edge-flush-ms",
            "20ms",
            "--usage",
            "request",
        ])
        .unwrap();
        let config = SimConfig::try_from(&args).unwrap();
        assert_eq!(config.gap, Duration::from_millis(30));
        assert_eq!(config.stall_at, vec![5, 9]);
        assert_eq!(config.edge_flush_interval, Some(Duration::from_millis(20)));
        assert_eq!(config.usage, UsageMode::Request);
    }

    #[test]
    fn phase_flags_are_parsed() {
        let args = parse(&[
            "--reasoning-tokens",
            "40",
            "--think-pause",
            "500ms",
            "--tool-calls",
            "2",
            "--tool-call-tokens",
            "6",
            "--think-tags",
            "open-in-prompt",
            "--reasoning-field",
            "both",
            "--responses-reasoning",
            "text",
        ])
        .unwrap();
        let config = SimConfig::try_from(&args).unwrap();
        assert_eq!(config.reasoning_tokens, 40);
        assert_eq!(config.think_pause, Duration::from_millis(500));
        assert_eq!((config.tool_calls, config.tool_call_tokens), (2, 6));
        assert_eq!(config.think_tags, ThinkTags::OpenInPrompt);
        assert_eq!(config.reasoning_field, ReasoningField::Both);
        assert_eq!(config.responses_reasoning, ResponsesReasoning::Text);
        let args = parse(&["--tool-call-tokens", "0"]).unwrap();
        let err = SimConfig::try_from(&args).unwrap_err().to_string();
        assert!(err.starts_with("--tool-call-tokens"), "{err}");
    }

    #[test]
    fn websocket_flags_are_parsed() {
        let args = parse(&[
            "--ws-deflate",
            "deny",
            "--ws-fragment",
            "1024",
            "--ws-ping",
            "1s",
            "--ws-close",
            "4001:bye now",
            "--ws-close-after",
            "2",
            "--audio-per-token",
            "20ms",
        ])
        .unwrap();
        let ws = SimConfig::try_from(&args).unwrap().websocket;
        assert!(!ws.deflate);
        assert_eq!(ws.fragment, Some(1024));
        assert_eq!(ws.ping, Some(Duration::from_secs(1)));
        let close = ws.close.clone().unwrap();
        assert_eq!((close.code, close.reason.as_str()), (4001, "bye now"));
        assert_eq!(ws.close_after, 2);
        assert_eq!(ws.audio_bytes_per_token(), 960);
        let err = parse(&["--ws-close", "1006"]).err().unwrap().to_string();
        assert!(err.contains("--ws-close"), "{err}");
        assert!(
            parse(&["--ws-close-after", "3"]).is_err(),
            "needs --ws-close"
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let err = parse(&["--gap", "50"]).err().unwrap().to_string();
        assert!(err.contains("--gap"), "{err}");
        let args = parse(&["--jitter=-1"]).unwrap();
        let err = SimConfig::try_from(&args).unwrap_err().to_string();
        assert!(err.starts_with("--jitter"), "{err}");
        let args = parse(&["--stall-at", "0"]).unwrap();
        let err = SimConfig::try_from(&args).unwrap_err().to_string();
        assert!(err.starts_with("--stall-at"), "{err}");
    }
}
