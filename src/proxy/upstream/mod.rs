//! The upstream side of the proxy: sending a request to the inference server and reading its
//! response.
//!
//! Plain-http upstreams go through metronome's own HTTP/1.1 client ([`crate::http1::client`]):
//! the response body reads its connection when the egress body polls it, so a frame crosses the
//! proxy in one poll of one task. https upstreams (and every upstream under
//! `server.upstream_client = "hyper"`) go through hyper-util's pooled client. Either way the
//! caller gets an [`UpstreamBody`] and, on failure, an [`UpstreamError`] that keeps its cause's
//! type and says which kind of failure it was.

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

use super::client_body::{BodyTooLarge, ClientBodyFailed, RequestBody};
use crate::error;
use crate::http1::client::{
    interim_allowed, ClientError, Http1Client, Http1ResponseBody, Http1ResponseBodyError,
};
use crate::http1::decode::Incomplete;

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
                    .map_err(UpstreamError::Hyper)?;
                let interim = refused.load(Ordering::Relaxed);
                if let Ok(status) = http::StatusCode::from_u16(interim) {
                    return Err(UpstreamError::unexpected_interim(status));
                }
                Ok(response.map(|body| UpstreamBody::Hyper { body }))
            }
        }
    }
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

    /// Why the native client got no response head, by its error's variant.
    pub fn of_native(error: &ClientError) -> Self {
        match error {
            ClientError::Connect(_) => UpstreamFailure::Connect,
            ClientError::ConnectTimeout(_) => UpstreamFailure::Timeout,
            ClientError::Send(_)
            | ClientError::RequestBody(_)
            | ClientError::NoResponse
            | ClientError::HeadCut
            | ClientError::Read(_) => UpstreamFailure::Reset,
            ClientError::NoAuthority(_)
            | ClientError::HeadTooLong(_)
            | ClientError::Head(_)
            | ClientError::UnexpectedInterim(_) => UpstreamFailure::Protocol,
        }
    }

    /// Why hyper-util's client got no response head: its kind read from its causes.
    pub fn of_hyper(error: &hyper_util::client::legacy::Error) -> Self {
        let timed_out = error::find_cause::<std::io::Error>(error)
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        if timed_out {
            UpstreamFailure::Timeout
        } else if error.is_connect() {
            UpstreamFailure::Connect
        } else if error::is_connection_lost(error) {
            UpstreamFailure::Reset
        } else {
            UpstreamFailure::Protocol
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

/// A request that got no response head from the upstream, with its cause as the client that
/// sent it gave it.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// From metronome's own HTTP/1.1 client.
    #[error(transparent)]
    Native(#[from] ClientError),
    /// From hyper-util's client.
    #[error(transparent)]
    Hyper(hyper_util::client::legacy::Error),
    /// hyper-util's client skipped an interim answer that [`interim_allowed`] refuses.
    #[error("the upstream answered {0}, which was not asked for")]
    UnexpectedInterim(http::StatusCode),
}

// === impl UpstreamError ===

impl UpstreamError {
    /// An interim answer that [`interim_allowed`] refuses, or a 1xx given as the response.
    pub fn unexpected_interim(status: http::StatusCode) -> Self {
        UpstreamError::UnexpectedInterim(status)
    }

    /// Which kind of failure, read from the cause's type.
    pub fn failure(&self) -> UpstreamFailure {
        match self {
            UpstreamError::Native(error) => UpstreamFailure::of_native(error),
            UpstreamError::Hyper(error) => UpstreamFailure::of_hyper(error),
            UpstreamError::UnexpectedInterim(_) => UpstreamFailure::Protocol,
        }
    }

    /// The client's request body went past `limits.max_request_body_bytes` (answered 413).
    pub fn body_too_large(&self) -> bool {
        error::is_caused_by::<BodyTooLarge>(self)
    }

    /// The client's request body failed (answered 400, not counted as the upstream's error).
    pub fn client_body_failed(&self) -> bool {
        error::is_caused_by::<ClientBodyFailed>(self)
    }
}

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
