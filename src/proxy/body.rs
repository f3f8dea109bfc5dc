//! The response body types the proxy hands the serving connection (the native HTTP/1.1 server, or
//! hyper's for HTTP/2): a metered stream, a pass-through body that only
//! times the request, or a small body metronome wrote itself (errors).
//!
//! The request side ([`ClientBody`], [`RequestBody`] and their errors) lives in
//! [`super::client_body`], which the upstream clients read without this module's response
//! side (that would close a cycle through the metered body); it is re-exported here so a
//! handler names one module for its bodies.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

pub use super::client_body::{BodyTooLarge, ClientBody, ClientBodyFailed, RequestBody};
use super::metered::EgressBody;
use super::usage_body::UsageBody;
use super::BoxError;
use crate::metrics::Metrics;

pin_project_lite::pin_project! {
    /// Any response body the proxy sends.
    #[project = ProxyBodyProj]
    pub enum ProxyBody {
        /// A metered stream.
        Metered { #[pin] body: EgressBody },
        /// A response that is not a stream: passed through, timed at its end, and, when it is
        /// a JSON answer, its usage read then (`UsageBody`). Boxed: hyper keeps a response
        /// body's slot for the whole response (and an HTTP/1 connection's for the connection's
        /// life), and a metered stream's would otherwise be this one's size: 208 bytes rather
        /// than 40 (`tests::a_response_body_takes_a_few_words` prints it).
        Passthrough { body: Pin<Box<TimedBody<UsageBody<super::upstream::UpstreamBody>>>> },
        /// A body metronome wrote (an error, a health answer).
        Local { #[pin] body: Full<Bytes> },
    }
}

// === impl ProxyBody ===

impl ProxyBody {
    /// A body of the given bytes.
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        ProxyBody::Local {
            body: Full::new(bytes.into()),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ProxyBodyProj::Metered { body } => body.poll_frame(cx),
            ProxyBodyProj::Passthrough { body } => body.as_mut().poll_frame(cx),
            ProxyBodyProj::Local { body } => body.poll_frame(cx).map_err(|e| match e {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Metered { body } => body.is_end_stream(),
            ProxyBody::Passthrough { body } => body.is_end_stream(),
            ProxyBody::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Metered { body } => body.size_hint(),
            ProxyBody::Passthrough { body } => body.size_hint(),
            ProxyBody::Local { body } => body.size_hint(),
        }
    }
}

/// Records `metronome_request_duration_seconds` once, when the body ends or is dropped, writes
/// the request's access log line then, and holds the request's place among those in flight
/// until then.
#[derive(Debug)]
struct DurationRecorder {
    metrics: Arc<Metrics>,
    route: Arc<str>,
    received: Instant,
    status: u16,
    /// The request's method, path and ID, for the access log.
    line: crate::logging::RequestLine,
    /// How the body ended, as the access log says it: `client_cancelled` until the upstream's
    /// body ends (`complete`) or fails (`upstream_error`).
    outcome: &'static str,
    _in_flight: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for DurationRecorder {
    fn drop(&mut self) {
        let duration = self.received.elapsed();
        self.metrics
            .request_duration
            .observe(&[&self.route], duration.as_secs_f64());
        crate::logging::access(&crate::logging::AccessRecord {
            line: Some(&self.line),
            route: &self.route,
            status: self.status,
            duration: Some(duration),
            outcome: self.outcome,
            ..Default::default()
        });
    }
}

pin_project_lite::pin_project! {
    /// An upstream body passed through untouched; the request's duration is recorded, and its
    /// access log line written, at its end.
    #[derive(Debug)]
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        recorder: Option<DurationRecorder>,
    }
}

// === impl TimedBody ===

impl<B> TimedBody<B> {
    /// Wraps `inner`; the duration runs from `received` to the body's end, and `status` is the
    /// one sent to the client, for the access log.
    pub fn new(
        inner: B,
        metrics: Arc<Metrics>,
        route: Arc<str>,
        received: Instant,
        status: http::StatusCode,
        line: crate::logging::RequestLine,
        in_flight: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        TimedBody {
            inner,
            recorder: Some(DurationRecorder {
                metrics,
                route,
                received,
                status: status.as_u16(),
                line,
                outcome: "client_cancelled",
                _in_flight: in_flight,
            }),
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner;
        let result = inner.as_mut().poll_frame(cx).map_err(Into::into);
        let outcome = match &result {
            Poll::Ready(None) => "complete",
            Poll::Ready(Some(Err(_))) => "upstream_error",
            Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => {
                // A body with a content-length is not asked for its end: its last frame is.
                // The duration still runs until the server lets go of the body.
                if let Some(recorder) = this.recorder.as_mut() {
                    recorder.outcome = "complete";
                }
                return result;
            }
            _ => return result,
        };
        if let Some(mut recorder) = this.recorder.take() {
            recorder.outcome = outcome;
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

    /// hyper holds a response body's slot for the whole response, so a metered stream must not
    /// pay for the largest variant's size.
    #[test]
    fn a_response_body_takes_a_few_words() {
        let size = std::mem::size_of::<ProxyBody>();
        assert!(size <= 48, "ProxyBody takes {size} bytes");
    }
}
