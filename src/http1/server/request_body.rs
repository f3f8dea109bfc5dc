//! A client's request body on the native HTTP/1.1 server: the connection decodes it off its
//! socket ([`Feeder`]) and hands it, one piece at a time, to whoever sends it upstream
//! ([`Http1RequestBody`]), which may be the connection's own task (metronome's upstream client)
//! or another (hyper-util's, for https upstreams).
//!
//! One piece is held at a time: the connection reads the socket again only once the last piece
//! was taken, so a slow upstream slows the client down instead of filling memory. The connection
//! writes `100 Continue` only when the body is first asked for, as hyper does, so a request
//! refused from its head alone (413, 503) is answered before the client sends its body.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::http1::decode::{BodyLength, DecodeError, Decoded, Decoder};
use crate::http1::{set_waker, BoxError};

/// Why a request body ended before its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestBodyError {
    /// The client closed the connection, or it broke, within the body.
    #[error("the client closed the connection within the request body")]
    Closed,
    /// The body's chunked coding was broken.
    #[error("invalid chunked request body")]
    Invalid(#[source] DecodeError),
}

/// What the two ends share.
#[derive(Debug, Default)]
struct Slot {
    /// The next piece, or the error that ended the body.
    piece: Option<Result<Bytes, RequestBodyError>>,
    /// The body's end was reached (after the last piece is taken).
    ended: bool,
    /// The receiver has asked for the body at least once.
    asked: bool,
    /// The receiver was dropped: nobody will take another piece.
    dropped: bool,
    /// Bytes still to come, when the length was declared.
    remaining: Option<u64>,
    receiver: Option<Waker>,
    connection: Option<Waker>,
}

type SharedSlot = Arc<Mutex<Slot>>;

/// The slot, poisoned or not: a panic while it was held leaves a piece, a flag or a waker, each
/// whole (the policy of `crate::poison`, which this wire layer does not depend on).
fn lock(shared: &SharedSlot) -> std::sync::MutexGuard<'_, Slot> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The request body as the request handler gets it.
#[derive(Debug)]
pub struct Http1RequestBody {
    /// `None`: the request has no body.
    shared: Option<SharedSlot>,
}

// === impl Http1RequestBody ===

impl Http1RequestBody {
    /// The body of a request that has none.
    pub fn empty() -> Self {
        Http1RequestBody { shared: None }
    }
}

impl Body for Http1RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(None);
        };
        let mut slot = lock(shared);
        let wake = slot.connection.take();
        let polled = match slot.piece.take() {
            Some(Ok(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Some(Err(e)) => {
                slot.ended = true;
                Poll::Ready(Some(Err(e.into())))
            }
            None if slot.ended => Poll::Ready(None),
            None => {
                slot.asked = true;
                set_waker(&mut slot.receiver, cx);
                Poll::Pending
            }
        };
        drop(slot);
        if let Some(waker) = wake {
            waker.wake();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared.as_ref().is_none_or(|shared| {
            let slot = lock(shared);
            slot.ended && slot.piece.is_none()
        })
    }

    fn size_hint(&self) -> SizeHint {
        let Some(shared) = &self.shared else {
            return SizeHint::with_exact(0);
        };
        let slot = lock(shared);
        match slot.remaining {
            Some(n) => {
                let held = match &slot.piece {
                    Some(Ok(data)) => data.len() as u64,
                    _ => 0,
                };
                SizeHint::with_exact(n + held)
            }
            None => SizeHint::default(),
        }
    }
}

impl Drop for Http1RequestBody {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let mut slot = lock(shared);
            slot.dropped = true;
            let wake = slot.connection.take();
            drop(slot);
            if let Some(waker) = wake {
                waker.wake();
            }
        }
    }
}

/// What feeding the body came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    /// The whole body was read off the connection.
    Complete,
    /// The receiver let go of the body before its end: the rest is still in the connection, which
    /// cannot carry another request.
    Abandoned,
}

/// The connection's end: decodes the body out of the connection's read buffer and socket.
#[derive(Debug)]
pub struct Feeder {
    shared: SharedSlot,
    decoder: Decoder,
    /// `100 Continue` still to be written (the bytes of it not yet written).
    continue_left: usize,
}

/// The interim response to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A request body of `length` and the connection's end of it; `None` for a request without one.
pub fn channel(length: BodyLength, expects_continue: bool) -> (Http1RequestBody, Option<Feeder>) {
    let remaining = match length {
        BodyLength::Empty | BodyLength::Length(0) => return (Http1RequestBody::empty(), None),
        BodyLength::Length(n) => Some(n),
        BodyLength::Chunked | BodyLength::UntilClose => None,
    };
    let shared = Arc::new(Mutex::new(Slot {
        remaining,
        ..Slot::default()
    }));
    let feeder = Feeder {
        shared: shared.clone(),
        decoder: Decoder::strict(length),
        continue_left: if expects_continue { CONTINUE.len() } else { 0 },
    };
    (
        Http1RequestBody {
            shared: Some(shared),
        },
        Some(feeder),
    )
}

// === impl Feeder ===

impl Feeder {
    /// Moves the body along: decodes what `buf` holds, reads the socket when the receiver has
    /// taken the last piece, and writes `100 Continue` when it first asks. Ready once the body
    /// was read whole or abandoned; an error when the client's connection failed it.
    pub fn poll_feed<I>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut I,
        buf: &mut BytesMut,
        read_size: usize,
    ) -> Poll<Result<Fed, RequestBodyError>>
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        loop {
            {
                let mut slot = lock(&self.shared);
                if slot.dropped {
                    drop(slot);
                    return Poll::Ready(Ok(self.after_drop(buf)));
                }
                if slot.piece.is_some() || (self.continue_left > 0 && !slot.asked) {
                    set_waker(&mut slot.connection, cx);
                    return Poll::Pending;
                }
            }
            while self.continue_left > 0 {
                let from = CONTINUE.len() - self.continue_left;
                match Pin::new(&mut *io).poll_write(cx, &CONTINUE[from..]) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Err(self.fail(RequestBodyError::Closed)))
                    }
                    Poll::Ready(Ok(n)) => self.continue_left -= n,
                    Poll::Pending => return Poll::Pending,
                }
                if self.continue_left == 0 {
                    // At once on a plain socket; over TLS what stays buffered goes with the
                    // next write, which flushes.
                    let _ = Pin::new(&mut *io).poll_flush(cx);
                }
            }
            match self.decoder.decode(buf) {
                Ok(Decoded::Data(data)) => {
                    // A body of declared length is over with its last byte: it ends with that
                    // piece, so the receiver needs no second wake-up to learn it (and sends the
                    // body upstream with the head, in one write, when both came in one read).
                    let last = self.decoder.is_done();
                    self.give(Ok(data), last);
                    if last {
                        return Poll::Ready(Ok(Fed::Complete));
                    }
                }
                Ok(Decoded::End(_trailers)) => {
                    self.end();
                    return Poll::Ready(Ok(Fed::Complete));
                }
                Ok(Decoded::NeedMore) => {
                    if buf.capacity() - buf.len() < read_size / 2 {
                        buf.reserve(read_size);
                    }
                    match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf) {
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                            return Poll::Ready(Err(self.fail(RequestBodyError::Closed)))
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(e) => return Poll::Ready(Err(self.fail(RequestBodyError::Invalid(e)))),
            }
        }
    }

    /// The receiver let go: the body counts as read whole when its end is already in `buf` (a
    /// client that takes a body of declared length drops it after its last byte, before its
    /// end is decoded), so the connection can carry the next request.
    fn after_drop(&mut self, buf: &mut BytesMut) -> Fed {
        loop {
            match self.decoder.decode(buf) {
                Ok(Decoded::Data(_)) => {}
                Ok(Decoded::End(_)) => return Fed::Complete,
                Ok(Decoded::NeedMore) | Err(_) => return Fed::Abandoned,
            }
        }
    }

    /// Hands the receiver a piece (the body's last when `last`) and wakes it.
    fn give(&mut self, piece: Result<Bytes, RequestBodyError>, last: bool) {
        let mut slot = lock(&self.shared);
        if let (Some(n), Ok(data)) = (&mut slot.remaining, &piece) {
            *n = n.saturating_sub(data.len() as u64);
        }
        slot.piece = Some(piece);
        slot.ended |= last;
        let wake = slot.receiver.take();
        drop(slot);
        if let Some(waker) = wake {
            waker.wake();
        }
    }

    fn end(&mut self) {
        let mut slot = lock(&self.shared);
        slot.ended = true;
        let wake = slot.receiver.take();
        drop(slot);
        if let Some(waker) = wake {
            waker.wake();
        }
    }

    fn fail(&mut self, error: RequestBodyError) -> RequestBodyError {
        self.give(Err(error.clone()), false);
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;

    /// Feeds `body` from a socket whose peer writes `wire` and then `then_close`s, collecting
    /// what the receiver gets; returns it with what the feeder said.
    async fn feed(
        length: BodyLength,
        wire: &'static [u8],
        close: bool,
    ) -> (Result<Bytes, String>, Result<Fed, RequestBodyError>) {
        let (mut peer, mut io) = tokio::io::duplex(64);
        tokio::spawn(async move {
            for piece in wire.chunks(7) {
                peer.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
            if !close {
                std::future::pending::<()>().await;
            }
        });
        let (body, feeder) = channel(length, false);
        let mut feeder = feeder.unwrap();
        let collecting = tokio::spawn(async move {
            body.collect()
                .await
                .map(|c| c.to_bytes())
                .map_err(|e| e.to_string())
        });
        let mut buf = BytesMut::new();
        let fed = std::future::poll_fn(|cx| feeder.poll_feed(cx, &mut io, &mut buf, 16)).await;
        (collecting.await.unwrap(), fed)
    }

    #[tokio::test]
    async fn a_body_of_declared_length_arrives_whole() {
        let (got, fed) = feed(BodyLength::Length(20), b"0123456789abcdefghij", false).await;
        assert_eq!(got.unwrap(), &b"0123456789abcdefghij"[..]);
        assert_eq!(fed, Ok(Fed::Complete));
    }

    #[tokio::test]
    async fn a_chunked_body_is_decoded() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\ntrailer: x\r\n\r\n";
        let (got, fed) = feed(BodyLength::Chunked, wire, false).await;
        assert_eq!(got.unwrap(), &b"hello, world"[..]);
        assert_eq!(fed, Ok(Fed::Complete));
    }

    #[tokio::test]
    async fn a_client_that_closes_within_the_body_fails_it_at_both_ends() {
        let (got, fed) = feed(BodyLength::Length(20), b"0123456789", true).await;
        assert!(got.unwrap_err().contains("closed"));
        assert_eq!(fed, Err(RequestBodyError::Closed));
        let (got, fed) = feed(BodyLength::Chunked, b"5\r\nhelloXX", false).await;
        assert!(got.unwrap_err().contains("chunked"));
        assert!(matches!(fed, Err(RequestBodyError::Invalid(_))));
    }

    #[tokio::test]
    async fn a_dropped_receiver_abandons_the_body() {
        let (_peer, mut io) = tokio::io::duplex(64);
        let (body, feeder) = channel(BodyLength::Length(5), false);
        let mut feeder = feeder.unwrap();
        let mut buf = BytesMut::from(&b"ab"[..]);
        drop(body);
        let fed = std::future::poll_fn(|cx| feeder.poll_feed(cx, &mut io, &mut buf, 16)).await;
        assert_eq!(fed, Ok(Fed::Abandoned));
    }

    #[tokio::test]
    async fn a_body_dropped_after_its_last_byte_was_read_whole() {
        let (_peer, mut io) = tokio::io::duplex(64);
        // A chunked body's end is decoded after its last piece is taken; one of declared
        // length is whole with its last piece.
        for (length, wire, whole_with_last_piece) in [
            (BodyLength::Length(5), &b"abcde"[..], true),
            (BodyLength::Chunked, &b"5\r\nabcde\r\n0\r\n\r\n"[..], false),
        ] {
            let (mut body, feeder) = channel(length, false);
            let mut feeder = feeder.unwrap();
            let mut buf = BytesMut::from(wire);
            let fed =
                std::future::poll_fn(|cx| Poll::Ready(feeder.poll_feed(cx, &mut io, &mut buf, 16)))
                    .await;
            if whole_with_last_piece {
                assert_eq!(fed, Poll::Ready(Ok(Fed::Complete)));
            } else {
                assert!(fed.is_pending());
            }
            let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
            assert!(matches!(first.await, Poll::Ready(Some(Ok(_)))));
            assert_eq!(body.is_end_stream(), whole_with_last_piece);
            drop(body);
            if !whole_with_last_piece {
                let fed =
                    std::future::poll_fn(|cx| feeder.poll_feed(cx, &mut io, &mut buf, 16)).await;
                assert_eq!(fed, Ok(Fed::Complete));
            }
        }
    }

    /// The receiver of a body of declared length learns its end with its last piece: the next
    /// poll ends the body without the connection feeding it again (so the upstream client
    /// writes a request that came whole in one write, head and body together).
    #[tokio::test]
    async fn a_body_of_declared_length_ends_with_its_last_piece() {
        let (_peer, mut io) = tokio::io::duplex(64);
        let (mut body, feeder) = channel(BodyLength::Length(5), false);
        let mut feeder = feeder.unwrap();
        let mut buf = BytesMut::from(&b"abcde"[..]);
        let fed =
            std::future::poll_fn(|cx| Poll::Ready(feeder.poll_feed(cx, &mut io, &mut buf, 16)))
                .await;
        assert_eq!(fed, Poll::Ready(Ok(Fed::Complete)));
        drop(feeder);
        let frames = std::future::poll_fn(|cx| {
            let first = Pin::new(&mut body).poll_frame(cx);
            let second = Pin::new(&mut body).poll_frame(cx);
            Poll::Ready((first, second))
        });
        let (first, second) = frames.await;
        let Poll::Ready(Some(Ok(first))) = first else {
            panic!("the piece: {first:?}");
        };
        assert_eq!(first.into_data().unwrap(), &b"abcde"[..]);
        assert!(matches!(second, Poll::Ready(None)), "{second:?}");
    }

    #[tokio::test]
    async fn continue_is_written_only_once_the_body_is_asked_for() {
        let (mut peer, mut io) = tokio::io::duplex(256);
        let (mut body, feeder) = channel(BodyLength::Length(3), true);
        let mut feeder = feeder.unwrap();
        let mut buf = BytesMut::new();
        // Not asked yet: nothing written, nothing read.
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(feeder.poll_feed(cx, &mut io, &mut buf, 16)))
                .await;
        assert!(polled.is_pending());
        let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
        assert!(first.await.is_pending());
        let feeding = tokio::spawn(async move {
            let fed = std::future::poll_fn(|cx| feeder.poll_feed(cx, &mut io, &mut buf, 16)).await;
            (fed, io)
        });
        let mut got = [0u8; CONTINUE.len()];
        tokio::io::AsyncReadExt::read_exact(&mut peer, &mut got)
            .await
            .unwrap();
        assert_eq!(&got, CONTINUE);
        peer.write_all(b"abc").await.unwrap();
        let data = body.collect().await.unwrap().to_bytes();
        assert_eq!(data, &b"abc"[..]);
        assert_eq!(feeding.await.unwrap().0, Ok(Fed::Complete));
    }

    #[test]
    fn a_declared_length_is_the_size_hint_and_no_body_is_empty() {
        let (body, _feeder) = channel(BodyLength::Length(9), false);
        assert_eq!(body.size_hint().exact(), Some(9));
        let (body, feeder) = channel(BodyLength::Empty, true);
        assert!(feeder.is_none());
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
