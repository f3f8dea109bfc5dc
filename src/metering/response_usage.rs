//! The usage of a non-streaming response, added to the token counters a stream adds to.
//!
//! A non-streaming answer is no stream: it has no token events, no TTFT, no gaps and no stream
//! ID, and is not kept at `/streams`. What it has is the usage its body reports, read whole
//! ([`crate::format::whole`]) once the body has ended. The figures go to
//! `metronome_output_tokens_total{source="usage"}`, `metronome_prompt_tokens_total` and
//! `metronome_reasoning_tokens_total` with the route and the model the body names (bounded as a
//! stream's is), each believed only within [`MAX_STREAM_TOKENS`](super::usage::MAX_STREAM_TOKENS)
//! and added with saturation. A body that could not be read counts in
//! `metronome_unparsed_events_total` as an event would: `invalid`, or `oversize` for one longer
//! than `metering.max_usage_body_bytes`, which was forwarded without a copy.

use super::usage::UsageRefusals;
use crate::format::{whole, Format};
use crate::metrics::counter::add_saturating;
use crate::metrics::Metrics;

/// What is known of a response's API before its body: the route's `format`, and the one its
/// request path names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FormatHints {
    /// The route's configured `format`.
    pub configured: Option<Format>,
    /// The API the request path belongs to ([`Format::from_path`]).
    pub path: Option<Format>,
}

// === impl FormatHints ===

impl FormatHints {
    /// A body may be read: the route names its API, or the request's path does. A response on
    /// any other path (embeddings, model lists) is not copied at all.
    pub fn readable(&self) -> bool {
        self.configured.or(self.path).is_some()
    }
}

/// Reads the usage of a whole, complete response `body` on `route` and adds it to the counters.
pub fn record(metrics: &Metrics, route: &str, body: &[u8], hints: FormatHints) {
    let Some(read) = whole::read(body, hints.configured, hints.path) else {
        return;
    };
    if read.unparsed {
        count_unread(metrics, route, "invalid");
        return;
    }
    let mut refusals = UsageRefusals::default();
    let output = read.usage_total.and_then(|n| refusals.accept(None, n));
    let prompt = read.usage_prompt.and_then(|n| refusals.accept(None, n));
    let reasoning = read.usage_reasoning.and_then(|n| refusals.accept(None, n));
    for (count, reason) in refusals.by_reason() {
        if count > 0 {
            add_saturating(
                &metrics.unparsed_events.with_label_values(&[route, reason]),
                count,
            );
        }
    }
    let figures = [output, prompt, reasoning];
    if figures.iter().all(|n| n.unwrap_or(0) == 0) {
        // Nothing to add: a model label is not taken up for it.
        return;
    }
    let model = metrics.models.resolve(read.model);
    let model = &*model;
    if let Some(n) = output.filter(|n| *n > 0) {
        let counter = metrics
            .output_tokens
            .with_label_values(&[route, model, "usage"]);
        add_saturating(&counter, n);
    }
    if let Some(n) = prompt.filter(|n| *n > 0) {
        add_saturating(&metrics.prompt_tokens.with_label_values(&[route, model]), n);
    }
    if let Some(n) = reasoning.filter(|n| *n > 0) {
        let counter = metrics.reasoning_tokens.with_label_values(&[route, model]);
        add_saturating(&counter, n);
    }
}

/// A complete response on `route` longer than `metering.max_usage_body_bytes`: forwarded
/// without a copy, its usage unread.
pub fn record_over_bound(metrics: &Metrics, route: &str, bound: usize) {
    tracing::debug!(
        route,
        bound,
        "a non-streaming response is longer than metering.max_usage_body_bytes: its usage is not read"
    );
    count_unread(metrics, route, "oversize");
}

fn count_unread(metrics: &Metrics, route: &str, reason: &str) {
    metrics
        .unparsed_events
        .with_label_values(&[route, reason])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metering::usage::MAX_STREAM_TOKENS;

    fn metrics() -> Metrics {
        let models = crate::metrics::ModelLabels::new(&[], 8);
        let buckets = crate::metrics::Buckets::default();
        Metrics::new(&buckets, models, std::time::Duration::from_millis(200)).unwrap()
    }

    fn chat() -> FormatHints {
        FormatHints {
            configured: None,
            path: Format::from_path("/v1/chat/completions"),
        }
    }

    fn tokens(m: &Metrics, model: &str) -> [u64; 3] {
        [
            m.output_tokens
                .with_label_values(&["chat", model, "usage"])
                .get(),
            m.prompt_tokens.with_label_values(&["chat", model]).get(),
            m.reasoning_tokens.with_label_values(&["chat", model]).get(),
        ]
    }

    fn unread(m: &Metrics, reason: &str) -> u64 {
        m.unparsed_events.with_label_values(&["chat", reason]).get()
    }

    #[test]
    fn usage_is_added_under_the_model_the_body_names() {
        let m = metrics();
        let body = br#"{"model":"q","choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":4}}}"#;
        record(&m, "chat", body, chat());
        record(&m, "chat", body, chat());
        assert_eq!(tokens(&m, "q"), [18, 10, 8]);
        let unnamed = br#"{"choices":[],"usage":{"completion_tokens":2}}"#;
        record(&m, "chat", unnamed, chat());
        assert_eq!(tokens(&m, "unknown"), [2, 0, 0]);
    }

    #[test]
    fn implausible_figures_and_unreadable_bodies_add_nothing_and_are_counted() {
        let m = metrics();
        let huge = format!(
            r#"{{"model":"q","choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{}}}}}"#,
            MAX_STREAM_TOKENS + 1
        );
        record(&m, "chat", huge.as_bytes(), chat());
        assert_eq!(tokens(&m, "q"), [0, 3, 0]);
        assert_eq!(unread(&m, "usage_over_bound"), 1);
        record(&m, "chat", b"{\"choices\":[", chat());
        assert_eq!(unread(&m, "invalid"), 1);
        record_over_bound(&m, "chat", 1024);
        assert_eq!(unread(&m, "oversize"), 1);
        record(&m, "chat", b"{\"data\":[]}", FormatHints::default());
        assert_eq!(unread(&m, "invalid"), 1);
        assert_eq!(tokens(&m, "unknown"), [0, 0, 0]);
    }

    #[test]
    fn a_body_is_read_only_where_an_api_is_named() {
        assert!(chat().readable());
        assert!(FormatHints {
            configured: Some(Format::Tgi),
            path: None
        }
        .readable());
        assert!(!FormatHints::default().readable());
    }
}
