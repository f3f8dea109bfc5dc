//! metronome: a sidecar proxy that makes the stutter of streamed LLM output visible.
//!
//! It forwards every streamed response byte for byte, stamps each frame when it arrives from the
//! inference server (ingress) and when its bytes reach the client's socket (egress), and exports
//! Prometheus histograms of time to first token, inter-token gaps, stalls and jank.
//!
//! Module map, in the order one request flows through them (ARCHITECTURE.md has the long form):
//!
//! - [`config`]: the TOML configuration, its defaults, validation and overrides.
//! - [`proxy`]: the listener, router, forwarder and the metered body (ingress reader, egress body,
//!   egress clock on the client socket).
//! - [`http1`]: HTTP/1.1 on the wire (head fields, `content-length`, chunk-size lines, the body
//!   decoder) and its two roles, the server for client connections and the client for upstreams,
//!   generic over the bodies they carry; below the proxy, which serves and sends with them.
//! - [`scan`]: the incremental SSE / NDJSON scanners; they read frames, never copy or change them.
//! - [`websocket`]: WebSocket frames (RFC 6455) read as they pass through a tunnel, with
//!   `permessage-deflate` inflated for reading only; a wire format like `http1`.
//! - [`format`]: token accounting per streaming API (which events carry tokens, and how many).
//! - [`metering`]: the per-frame core: meter (scan, classify at ingress), ledger (per-stream state,
//!   recorded once at the end) and clock; below the proxy.
//! - [`sketch`], [`prefetch`]: the gap sketch and the cache hints, leaves the layers above share.
//! - [`metrics`]: the Prometheus metric contract of docs/metrics.md.
//! - [`otlp`]: OpenTelemetry export of the same metrics (`[otlp]`), as OTLP protobufs.
//! - [`timeline`]: the bounded ring of recent streams and their frames (`/streams`).
//! - [`proxy::beacon`]: the browser beacon endpoint, recorded under `point="client"`.
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/readyz`, `/streams`).
//! - [`timeline_json`]: the JSON of a stream's timeline (`/streams/{id}`) as `probe --join` and
//!   `sim --replay` read it.
//! - [`sim`], [`probe`], [`demo`]: a streaming server with a cadence you set, a client that measures
//!   what arrives, and both wired around the proxy in one command.

// `unsafe` only where a module allows it (six do: prefetch, probe::limits, metering::clock,
// proxy::joined_writes, http1::server::writer, format::openai::template), and every block says
// why it is sound.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod admin;
pub mod batch;
pub mod config;
pub mod config_spans;
pub mod demo;
pub mod error;
pub mod format;
pub mod hex;
pub mod http1;
pub mod live;
pub mod logging;
pub mod metering;
pub mod metrics;
pub mod otlp;
pub mod poison;
pub mod prefetch;
pub mod probe;
pub mod proxy;
pub mod scan;
pub mod sim;
pub mod sketch;
pub mod slo;
pub mod timeline;
pub mod timeline_json;
pub mod tls;
pub mod trace_context;
pub mod units;
pub mod websocket;
