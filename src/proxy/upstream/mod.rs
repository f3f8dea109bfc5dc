//! The upstream side of the proxy: sending a request to the inference server and reading its
//! response.
//!
//! Plain-http upstreams go through [`native`], metronome's own HTTP/1.1 client: the response body
//! reads its connection when the egress body polls it, so a frame crosses the proxy in one poll
//! of one task. https upstreams (and every upstream under `server.upstream_client = "hyper"`)
//! go through hyper-util's pooled client. Either way the caller gets an [`UpstreamBody`] and, on
//! failure, an [`UpstreamError`] that says which kind of failure it was.

pub mod native;
pub mod pool;

use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::body::{BodyTooLarge, ClientBodyFailed, RequestBody};
use crate::error;
use crate::http1::decode::Incomplete;
use native::{Http1Client, Http1ResponseBody, Http1ResponseBodyError};

/// hyper-util's pooled client (http and https).
pub type HyperClient = Client<HttpsConnector<HttpConnector>, RequestBody>;

/// The client a worker's requests go upstream through.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    /// For http:// upstreams, unless hyper is asked for.
    native: Option<Http1Client>,
    /// For https:// upstreams (and all of them without `native`).
    hyper: HyperClient,
}

// === impl UpstreamClient ===

impl UpstreamClient {
    /// A client that sends plain-http requests through `native` when given, and everything else
    /// through `hyper`.
    pub fn new(native: Option<Http1Client>, hyper: HyperClient) -> Self {
        UpstreamClient { native, hyper }
    }

    /// The native client, when plain-http upstreams use it.
    pub fn native(&self) -> Option<&Http1Client> {
        self.native.as_ref()
    }

    /// hyper-util's client, for what only it does: upgrades (WebSocket tunnels), whatever
    /// `server.upstream_client` says.
    pub fn hyper(&self) -> &HyperClient {
        &self.hyper
    }

    /// Sends `request` (its URI absolute) and reads the response head.
    pub async fn request(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        match &self.native {
            Some(native) if request.uri().scheme_str() == Some("http") => {
                let response = native.request(request).await?;
                Ok(response.map(|body| UpstreamBody::Native { body }))
            }
            _ => {
                let mut request = request;
                // hyper skips interim answers itself; this sees the ones it must not skip.
                let refused = Arc::new(AtomicU16::new(0));
                let seen = refused.clone();
                hyper::ext::on_informational(&mut request, move |interim| {
                    if !interim_allowed(interim.status()) {
                        seen.store(interim.status().as_u16(), Ordering::Relaxed);
                    }
                });
                let response = self
                    .hyper
                    .request(request)
                    .await
                    .map_err(UpstreamError::from_hyper)?;
                let interim = refused.load(Ordering::Relaxed);
                if let Ok(status) = http::StatusCode::from_u16(interim) {
                    return Err(UpstreamError::unexpected_interim(status));
                }
                Ok(response.map(|body| UpstreamBody::Hyper { body }))
            }
        }
    }
}

/// Whether an interim (1xx) answer may come before the response: `100 Continue` and `103 Early
/// Hints` are skipped; any other (an unsolicited `101 Switching Protocols` above all) makes the
/// request fail as a protocol error (issue 26), on both clients.
pub fn interim_allowed(status: http::StatusCode) -> bool {
    status == http::StatusCode::CONTINUE || status.as_u16() == 103
}

/// Why a request got no upstream response, as `metronome_upstream_errors_total{kind}` and the
/// JSON error body say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The connection could not be made.
    Connect,
    /// It took too long (connecting).
    Timeout,
    /// The connection broke or closed before the response head.
    Reset,
    /// The upstream did not speak HTTP/1.1 as it must.
    Protocol,
}

// === impl UpstreamFailure ===

impl UpstreamFailure {
    /// The `kind` label.
    pub fn kind(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Reset => "reset",
            UpstreamFailure::Protocol => "protocol",
        }
    }

    /// Why a response body failed after its head: `Reset` when the connection was lost (reset,
    /// aborted, or closed before the body's end), `Protocol` when the upstream sent something
    /// that is not HTTP. Read from the error's types, from either client.
    pub fn of_body(error: &(dyn std::error::Error + 'static)) -> Self {
        if error::is_connection_lost(error) || error::is_caused_by::<Incomplete>(error) {
            UpstreamFailure::Reset
        } else {
            UpstreamFailure::Protocol
        }
    }
}

/// A request that got no response head from the upstream.
#[derive(Debug)]
pub struct UpstreamError {
    /// Which kind of failure.
    pub failure: UpstreamFailure,
    /// What went wrong, for the JSON error and the log.
    pub cause: String,
    /// The client's request body went past `limits.max_request_body_bytes` (answered 413).
    pub body_too_large: bool,
    /// The client's request body failed (answered 400, not counted as the upstream's error).
    pub client_body_failed: bool,
}

// === impl UpstreamError ===

impl UpstreamError {
    /// An error of this kind.
    pub fn new(failure: UpstreamFailure, cause: String) -> Self {
        UpstreamError {
            failure,
            cause,
            body_too_large: false,
            client_body_failed: false,
        }
    }

    /// An interim answer that [`interim_allowed`] refuses, or a 1xx given as the response.
    pub fn unexpected_interim(status: http::StatusCode) -> Self {
        UpstreamError::new(
            UpstreamFailure::Protocol,
            format!("the upstream answered {status}, which was not asked for"),
        )
    }

    /// Reads a hyper-util client error: its kind from its causes, its cause from the innermost.
    pub fn from_hyper(error: hyper_util::client::legacy::Error) -> Self {
        let timed_out = error::find_cause::<std::io::Error>(&error)
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        let failure = if timed_out {
            UpstreamFailure::Timeout
        } else if error.is_connect() {
            UpstreamFailure::Connect
        } else if error::is_connection_lost(&error) {
            UpstreamFailure::Reset
        } else {
            UpstreamFailure::Protocol
        };
        let cause = error::chain(&error)
            .last()
            .map(|e| e.to_string())
            .unwrap_or_else(|| error.to_string());
        UpstreamError {
            failure,
            cause,
            body_too_large: error::is_caused_by::<BodyTooLarge>(&error),
            client_body_failed: error::is_caused_by::<ClientBodyFailed>(&error),
        }
    }
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause)
    }
}

impl std::error::Error for UpstreamError {}

pin_project_lite::pin_project! {
    /// A response body from the upstream, from whichever client read its head.
    #[project = UpstreamBodyProj]
    #[derive(Debug)]
    pub enum UpstreamBody {
        /// Read off its connection by metronome's HTTP/1.1 client.
        Native { #[pin] body: Http1ResponseBody },
        /// Handed over by hyper's connection task.
        Hyper { #[pin] body: hyper::body::Incoming },
    }
}

/// Why an upstream response body failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamBodyError {
    /// From the native client.
    #[error("{0}")]
    Native(#[from] Http1ResponseBodyError),
    /// From hyper.
    #[error("{0}")]
    Hyper(#[from] hyper::Error),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamBodyError>>> {
        match self.project() {
            UpstreamBodyProj::Native { body } => body.poll_frame(cx).map_err(Into::into),
            UpstreamBodyProj::Hyper { body } => body.poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Native { body } => body.is_end_stream(),
            UpstreamBody::Hyper { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Native { body } => body.size_hint(),
            UpstreamBody::Hyper { body } => body.size_hint(),
        }
    }
}
