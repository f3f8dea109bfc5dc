//! A non-streaming response's body, forwarded frame by frame as it arrives while a bounded copy
//! is kept, so that its usage can be read once it has ended ([`crate::metering::response_usage`]).
//!
//! Only a 2xx `application/json` answer without a content coding, with metering on, on a route
//! whose format is set or whose request path names an API, is copied ([`reads_usage`]); any
//! other passes through the wrapper untouched. Every frame is handed on in the poll that read
//! it, the very same `Bytes`: the copy never holds one back. A one-frame body is kept by
//! reference (no copy); a second frame starts a copy of both. Past `metering.max_usage_body_bytes`
//! (or a declared length past it) the copy is dropped and the rest is not copied. The usage is
//! read when the upstream's body has ended: a body that fails or is dropped first (the client went
//! away) is not read, and adds nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header;
use http_body::{Body, Frame, SizeHint};

use crate::metering::response_usage::{self, FormatHints};
use crate::metrics::Metrics;

/// A response whose usage is read when it ends: its status is 2xx, its content type
/// `application/json` and its content coding none, metering is on and the bound is not 0, and
/// its API can be named (`hints`).
pub fn reads_usage(
    metering: &crate::config::MeteringConfig,
    status: http::StatusCode,
    headers: &http::HeaderMap,
    hints: FormatHints,
) -> bool {
    let identity = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.trim().eq_ignore_ascii_case("identity"));
    metering.enabled
        && metering.max_usage_body_bytes > 0
        && status.is_success()
        && identity
        && hints.readable()
        && super::headers::content_type_essence(headers).as_deref() == Some("application/json")
}

/// Where a response's usage goes once it has been read.
#[derive(Debug)]
pub struct UsageTarget {
    /// The families the figures are added to.
    pub metrics: Arc<Metrics>,
    /// The `route` label.
    pub route: Arc<str>,
    /// What names the response's API.
    pub hints: FormatHints,
    /// `metering.max_usage_body_bytes`.
    pub bound: usize,
}

// === impl UsageTarget ===

impl UsageTarget {
    /// Where the usage of the answer with head `parts` to the request `line` on `route` goes,
    /// when it is read at all ([`reads_usage`]).
    pub fn for_answer(
        metering: &crate::config::MeteringConfig,
        metrics: &Arc<Metrics>,
        route: &super::router::Route,
        line: &crate::logging::RequestLine,
        parts: &http::response::Parts,
    ) -> Option<Self> {
        let hints = FormatHints {
            configured: route.format,
            path: crate::format::whole::path_format(&line.path),
        };
        reads_usage(metering, parts.status, &parts.headers, hints).then(|| UsageTarget {
            metrics: metrics.clone(),
            route: route.name.clone(),
            hints,
            bound: metering.max_usage_body_bytes,
        })
    }
}

/// The bytes kept of a body so far.
#[derive(Debug, Default)]
enum Kept {
    /// No data yet.
    #[default]
    Nothing,
    /// One frame, by reference.
    One(Bytes),
    /// Several frames, copied together.
    Copied(Vec<u8>),
    /// More than the bound: nothing is kept.
    OverBound,
}

/// A body being copied, and where its usage goes.
#[derive(Debug)]
struct Copy {
    target: UsageTarget,
    kept: Kept,
}

// === impl Copy ===

impl Copy {
    /// Keeps `data` too, or gives the copy up past the bound.
    fn keep(&mut self, data: &Bytes) {
        if data.is_empty() {
            return;
        }
        let bound = self.target.bound;
        self.kept = match std::mem::take(&mut self.kept) {
            Kept::OverBound => Kept::OverBound,
            Kept::Nothing if data.len() <= bound => Kept::One(data.clone()),
            Kept::One(first) if first.len() + data.len() <= bound => {
                let mut copy = Vec::with_capacity(first.len() + data.len());
                copy.extend_from_slice(&first);
                copy.extend_from_slice(data);
                Kept::Copied(copy)
            }
            Kept::Copied(mut copy) if copy.len() + data.len() <= bound => {
                copy.extend_from_slice(data);
                Kept::Copied(copy)
            }
            _ => Kept::OverBound,
        };
    }

    /// The body ended: its usage is read and added.
    fn finish(self) {
        let target = &self.target;
        let body: &[u8] = match &self.kept {
            Kept::Nothing => return,
            Kept::One(bytes) => bytes,
            Kept::Copied(copy) => copy,
            Kept::OverBound => {
                response_usage::record_over_bound(&target.metrics, &target.route, target.bound);
                return;
            }
        };
        response_usage::record(&target.metrics, &target.route, body, target.hints);
    }
}

pin_project_lite::pin_project! {
    /// An upstream body passed through untouched, whose usage is read at its end when it has a
    /// [`UsageTarget`].
    #[derive(Debug)]
    pub struct UsageBody<B> {
        #[pin]
        inner: B,
        copy: Option<Box<Copy>>,
    }
}

// === impl UsageBody ===

impl<B: Body> UsageBody<B> {
    /// `inner`, copied for its usage when `target` is given, else only passed through.
    pub fn new(inner: B, target: Option<UsageTarget>) -> Self {
        let copy = target.map(|target| {
            // A body that declares itself longer than the bound is not copied from the start.
            let declared = inner.size_hint().lower();
            let kept = match usize::try_from(declared) {
                Ok(n) if n <= target.bound => Kept::Nothing,
                _ => Kept::OverBound,
            };
            Box::new(Copy { target, kept })
        });
        UsageBody { inner, copy }
    }

    /// `inner`, passed through without reading anything.
    pub fn untouched(inner: B) -> Self {
        UsageBody { inner, copy: None }
    }
}

impl<B> Body for UsageBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let result = inner.as_mut().poll_frame(cx);
        let Some(copy) = this.copy.as_mut() else {
            return result;
        };
        let ended = match &result {
            Poll::Pending => false,
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    copy.keep(data);
                }
                // A body with a content-length is not asked for its end: its last frame is.
                inner.is_end_stream()
            }
            Poll::Ready(Some(Err(_))) => {
                // A failed body says nothing that can be believed.
                *this.copy = None;
                false
            }
            Poll::Ready(None) => true,
        };
        if ended {
            if let Some(copy) = this.copy.take() {
                copy.finish();
            }
        }
        result
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Format;
    use http_body_util::{BodyExt, StreamBody};

    fn metrics() -> Arc<Metrics> {
        let models = crate::metrics::ModelLabels::new(&[], 8);
        let buckets = crate::metrics::Buckets::default();
        let stall = std::time::Duration::from_millis(200);
        Arc::new(Metrics::new(&buckets, models, stall).unwrap())
    }

    fn target(metrics: &Arc<Metrics>, bound: usize) -> UsageTarget {
        UsageTarget {
            metrics: metrics.clone(),
            route: Arc::from("chat"),
            hints: FormatHints {
                configured: None,
                path: Some(Format::OpenAi),
            },
            bound,
        }
    }

    type Piece = Result<Frame<Bytes>, std::io::Error>;

    /// A body of `pieces`, as a channel-fed body would give them.
    fn body(
        pieces: Vec<Piece>,
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Piece>>> {
        StreamBody::new(futures_util::stream::iter(pieces))
    }

    fn data(text: &str) -> Piece {
        Ok(Frame::data(Bytes::from(text.to_string())))
    }

    const ANSWER: &str = r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":4,"completion_tokens":7}}"#;

    fn output(m: &Metrics) -> u64 {
        m.output_tokens
            .with_label_values(&["chat", "m", "usage"])
            .get()
    }

    fn unread(m: &Metrics, reason: &str) -> u64 {
        m.unparsed_events.with_label_values(&["chat", reason]).get()
    }

    #[tokio::test]
    async fn frames_pass_unchanged_and_the_usage_is_read_at_the_end() {
        let m = metrics();
        let (a, b) = ANSWER.split_at(30);
        let pieces = vec![data(a), data(""), data(b)];
        let wrapped = UsageBody::new(body(pieces), Some(target(&m, 1024)));
        let got = wrapped.collect().await.unwrap().to_bytes();
        assert_eq!(got, ANSWER.as_bytes());
        assert_eq!(output(&m), 7);
        let prompt = m.prompt_tokens.with_label_values(&["chat", "m"]).get();
        assert_eq!(prompt, 4);
    }

    #[tokio::test]
    async fn a_body_over_the_bound_passes_and_is_counted_unread() {
        let m = metrics();
        let (a, b) = ANSWER.split_at(60);
        let wrapped = UsageBody::new(body(vec![data(a), data(b)]), Some(target(&m, 80)));
        let got = wrapped.collect().await.unwrap().to_bytes();
        assert_eq!(got, ANSWER.as_bytes());
        assert_eq!(output(&m), 0);
        assert_eq!(unread(&m, "oversize"), 1);
        let exact = UsageBody::new(body(vec![data(ANSWER)]), Some(target(&m, ANSWER.len())));
        exact.collect().await.unwrap();
        assert_eq!(output(&m), 7, "a body of exactly the bound is read");
    }

    #[tokio::test]
    async fn a_failed_or_dropped_body_adds_nothing() {
        let m = metrics();
        let failed = vec![data(ANSWER), Err(std::io::Error::other("reset"))];
        let wrapped = UsageBody::new(body(failed), Some(target(&m, 1024)));
        assert!(wrapped.collect().await.is_err());
        let mut dropped =
            UsageBody::new(body(vec![data(ANSWER), data(" ")]), Some(target(&m, 1024)));
        let first = dropped.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), ANSWER.as_bytes());
        drop(dropped);
        assert_eq!(output(&m), 0);
        assert_eq!(unread(&m, "invalid") + unread(&m, "oversize"), 0);
    }

    #[tokio::test]
    async fn a_declared_length_past_the_bound_is_never_copied() {
        let m = metrics();
        let full = http_body_util::Full::new(Bytes::from(ANSWER));
        let mut wrapped = UsageBody::new(full, Some(target(&m, 10)));
        assert!(matches!(
            wrapped.copy.as_deref().map(|c| &c.kept),
            Some(Kept::OverBound)
        ));
        let frame = wrapped.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), ANSWER.as_bytes());
        assert!(wrapped.copy.is_none(), "ended at its last frame");
        assert_eq!(unread(&m, "oversize"), 1);
    }

    #[tokio::test]
    async fn an_untouched_body_reads_nothing() {
        let m = metrics();
        let wrapped = UsageBody::untouched(body(vec![data(ANSWER)]));
        wrapped.collect().await.unwrap();
        assert_eq!(output(&m), 0);
    }

    /// Polls `body` to its end (its pieces are always ready): the bytes it gave.
    fn drain<B: Body<Data = Bytes>>(body: B) -> Vec<u8> {
        let mut body = std::pin::pin!(body);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
            let Ok(frame) = frame else { break };
            if let Ok(data) = frame.into_data() {
                out.extend_from_slice(&data);
            }
        }
        out
    }

    /// `body` cut at `cuts` (each taken modulo its length + 1), in order.
    fn cut(body: &[u8], cuts: &[usize]) -> Vec<Piece> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        at.push(0);
        at.push(body.len());
        at.sort_unstable();
        at.windows(2)
            .map(|w| Ok(Frame::data(Bytes::copy_from_slice(&body[w[0]..w[1]]))))
            .collect()
    }

    proptest::proptest! {
        /// Whatever the body and however it is cut, the client gets the upstream's bytes.
        #[test]
        fn the_forwarded_bytes_are_the_upstreams(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..12),
            bound in 0usize..4000,
        ) {
            let m = metrics();
            let wrapped = UsageBody::new(super::tests::body(cut(&body, &cuts)), Some(target(&m, bound)));
            proptest::prop_assert_eq!(drain(wrapped), body);
        }

        /// An answer is read whole however it is cut, exactly when it fits the bound.
        #[test]
        fn an_answer_is_read_whole_however_it_is_cut(
            pad in 0usize..700,
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..12),
            bound in 1usize..1000,
        ) {
            let m = metrics();
            let answer = format!(
                r#"{{"model":"m","choices":[{{"message":{{"content":"{}"}}}}],"usage":{{"completion_tokens":7}}}}"#,
                "x".repeat(pad)
            );
            let pieces = cut(answer.as_bytes(), &cuts);
            let wrapped = UsageBody::new(super::tests::body(pieces), Some(target(&m, bound)));
            proptest::prop_assert_eq!(drain(wrapped), answer.as_bytes());
            let fits = answer.len() <= bound;
            proptest::prop_assert_eq!(output(&m), if fits { 7 } else { 0 });
            proptest::prop_assert_eq!(unread(&m, "oversize"), u64::from(!fits));
        }
    }

    #[test]
    fn only_a_plain_successful_json_answer_is_read() {
        let config = crate::config::Config::from_toml("").unwrap();
        let metering = &config.metering;
        let ok = http::StatusCode::OK;
        let chat = FormatHints {
            configured: None,
            path: Some(Format::OpenAi),
        };
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = http::HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, http::HeaderValue::from_static(value));
            }
            map
        };
        let json = headers(&[("content-type", "application/json; charset=utf-8")]);
        assert!(reads_usage(metering, ok, &json, chat));
        let identity = headers(&[
            ("content-type", "Application/JSON"),
            ("content-encoding", "identity"),
        ]);
        assert!(reads_usage(metering, ok, &identity, chat));
        let gzip = headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ]);
        assert!(!reads_usage(metering, ok, &gzip, chat));
        let text = headers(&[("content-type", "text/plain")]);
        assert!(!reads_usage(metering, ok, &text, chat));
        assert!(!reads_usage(
            metering,
            http::StatusCode::BAD_REQUEST,
            &json,
            chat
        ));
        assert!(!reads_usage(metering, ok, &json, FormatHints::default()));
        let mut off = metering.clone();
        off.enabled = false;
        assert!(!reads_usage(&off, ok, &json, chat));
        let mut zero = metering.clone();
        zero.max_usage_body_bytes = 0;
        assert!(!reads_usage(&zero, ok, &json, chat));
    }
}
