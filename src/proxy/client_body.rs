//! A client's request body on its way upstream: [`ClientBody`], from whichever server read the
//! request, and [`RequestBody`], the same streamed with `limits.max_request_body_bytes`, whose
//! errors say whose fault a failed body was ([`BodyTooLarge`], [`ClientBodyFailed`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::BoxError;

pin_project_lite::pin_project! {
    /// A client's request body, from whichever server read the request.
    #[project = ClientBodyProj]
    #[derive(Debug)]
    pub enum ClientBody {
        /// Read by hyper's server (HTTP/2, and HTTP/1.x under `server.http1_server = "hyper"`).
        Hyper { #[pin] body: hyper::body::Incoming },
        /// Read by metronome's own HTTP/1.1 server ([`crate::http1::server`]).
        Native { #[pin] body: crate::http1::server::request_body::Http1RequestBody },
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ClientBodyProj::Hyper { body } => body.poll_frame(cx).map_err(Into::into),
            ClientBodyProj::Native { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper { body } => body.is_end_stream(),
            ClientBody::Native { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper { body } => body.size_hint(),
            ClientBody::Native { body } => body.size_hint(),
        }
    }
}

/// The request body as it goes upstream: the client's body, streamed, cut off with an error past
/// `limit` bytes so an oversized upload cannot run on.
#[derive(Debug)]
pub struct RequestBody {
    inner: ClientBody,
    remaining: u64,
    limit: u64,
}

/// A request body went past `limits.max_request_body_bytes`.
#[derive(Debug, thiserror::Error)]
#[error("the request body is larger than {0} bytes")]
pub struct BodyTooLarge(pub u64);

/// The client's request body failed (a broken chunked coding, a close within it): wraps the
/// client body's error so the upstream client's error says the fault was the client's.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed: {0}")]
pub struct ClientBodyFailed(#[source] pub BoxError);

// === impl RequestBody ===

impl RequestBody {
    /// Streams `inner`, allowing at most `limit` bytes.
    pub fn new(inner: ClientBody, limit: u64) -> Self {
        RequestBody {
            inner,
            remaining: limit,
            limit,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let len = data.len() as u64;
                if len > self.remaining {
                    return Poll::Ready(Some(Err(Box::new(BodyTooLarge(self.limit)))));
                }
                self.remaining -= len;
            }
        }
        polled.map_err(|e| Box::new(ClientBodyFailed(e)) as BoxError)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
