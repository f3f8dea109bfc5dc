//! Why the native client got no response, or its response body failed: each cause keeps its
//! type (an I/O error, httparse's, the request body's own), so whoever counts or answers the
//! failure reads what happened from the type, never from the message.

use std::time::Duration;

use http::StatusCode;

use crate::http1::decode::{DecodeError, Incomplete};
use crate::http1::BoxError;

/// Why a request sent by the native client got no response head.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request's URI names no authority to connect to.
    #[error("no authority in {0}")]
    NoAuthority(http::Uri),
    /// The TCP connection could not be made.
    #[error("tcp connect error")]
    Connect(#[source] std::io::Error),
    /// The TCP connection was not made within the connect timeout.
    #[error("tcp connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// Writing the request to the connection failed.
    #[error("cannot send the request")]
    Send(#[source] std::io::Error),
    /// The request body failed while it was sent: its error (whatever the caller's body type
    /// gave) is the cause.
    #[error("the request body could not be sent")]
    RequestBody(#[source] BoxError),
    /// The upstream closed the connection without a byte of response.
    #[error("connection closed before message completed: the upstream sent no response")]
    NoResponse,
    /// The upstream closed the connection within the response head.
    #[error("connection closed before message completed: the response head was cut off")]
    HeadCut,
    /// Reading the response head failed.
    #[error("cannot read the response")]
    Read(#[source] std::io::Error),
    /// The response head did not end within the longest head read (64 KiB).
    #[error("the response head is longer than {0} bytes")]
    HeadTooLong(usize),
    /// The response head is not HTTP/1.1 as a client may read it.
    #[error(transparent)]
    Head(#[from] ResponseHeadError),
    /// An interim answer that [`super::interim_allowed`] refuses (an unsolicited `101` above
    /// all).
    #[error("the upstream answered {0}, which was not asked for")]
    UnexpectedInterim(StatusCode),
}

/// Why a response head is refused.
#[derive(Debug, thiserror::Error)]
pub enum ResponseHeadError {
    /// httparse refused it.
    #[error("invalid response head")]
    Parse(#[source] httparse::Error),
    /// The status code is not one `http` takes (outside 100 to 999).
    #[error("invalid status code {0}")]
    Status(u16),
    /// A field name `http` does not take.
    #[error("invalid header name {0:?}")]
    FieldName(String),
    /// A field value `http` does not take, under this name.
    #[error("invalid value of header {0}")]
    FieldValue(String),
    /// The `content-length` field is not one length (RFC 9110 §8.6).
    #[error("{0}")]
    ContentLength(&'static str),
}

/// Why a response body from the native client failed.
#[derive(Debug, thiserror::Error)]
pub enum Http1ResponseBodyError {
    /// The upstream closed the connection before the body's end.
    #[error("connection closed before message completed: {0}")]
    Incomplete(#[from] Incomplete),
    /// The upstream broke the chunked framing.
    #[error("invalid response body: {0}")]
    Decode(#[from] DecodeError),
    /// Reading the socket failed (a reset).
    #[error("error reading the response body: {0}")]
    Io(#[from] std::io::Error),
}
