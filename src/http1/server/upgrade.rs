//! Protocol upgrades (RFC 9110 §7.8) on the native server: a request that asks for one
//! (`Connection: upgrade` and an `Upgrade` field) carries an [`OnUpgrade`] in its extensions;
//! when the service answers it `101 Switching Protocols`, the server writes that head and hands
//! over its connection, with any bytes the client sent past the request, as an [`Upgraded`].
//! The server then serves no more HTTP on it. A `101` to a request that asked for no upgrade is
//! never written: the connection is closed instead (an unsolicited switch would hand the client's
//! connection to whatever the service switched to).
//!
//! This is hyper's `upgrade::on` for metronome's own server, and generic as the server is: it
//! knows nothing of what the connection becomes (a WebSocket tunnel, in the proxy).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{header, HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::http1::head::list_elements;

/// A connection the server can hand over: any socket (plain, TLS) that may move to another task.
pub trait UpgradedIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> UpgradedIo for T {}

/// The connection after a `101`: the bytes the client sent past its request head first, then
/// the socket itself.
pub struct Upgraded {
    io: Box<dyn UpgradedIo>,
    read_ahead: Bytes,
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded")
            .field("read_ahead", &self.read_ahead.len())
            .finish_non_exhaustive()
    }
}

// === impl Upgraded ===

impl Upgraded {
    /// `io` with `read_ahead` to be read before it.
    pub fn new(io: Box<dyn UpgradedIo>, read_ahead: Bytes) -> Self {
        Upgraded { io, read_ahead }
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read_ahead.is_empty() {
            let n = self.read_ahead.len().min(buf.remaining());
            buf.put_slice(&self.read_ahead[..n]);
            self.read_ahead.advance(n);
            if self.read_ahead.is_empty() {
                self.read_ahead = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

/// In the extensions of a request that asked for an upgrade: the connection, once the service
/// answered `101` and the server wrote it. Extensions must be `Clone`, so the receiver sits in a
/// shared slot and is taken once.
#[derive(Debug, Clone)]
pub struct OnUpgrade(Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>);

// === impl OnUpgrade ===

impl OnUpgrade {
    /// The connection to come, once; `None` when it was taken before. Resolves to `None` when
    /// the server did not switch (another answer, or the connection closed first).
    pub fn take(&self) -> Option<impl Future<Output = Option<Upgraded>> + Send + 'static> {
        let receiver = self.0.lock().ok()?.take()?;
        Some(async move { receiver.await.ok() })
    }
}

/// The server's end of one request's upgrade.
#[derive(Debug)]
pub(super) struct Pending(oneshot::Sender<Upgraded>);

// === impl Pending ===

impl Pending {
    /// Hands the connection over.
    pub(super) fn hand_over(self, upgraded: Upgraded) {
        let _ = self.0.send(upgraded);
    }
}

/// Whether a request's fields ask for an upgrade (RFC 9110 §7.8: an `Upgrade` field, named in
/// `Connection`); if so, the pair that hands the connection over.
pub(super) fn requested(headers: &HeaderMap) -> Option<(OnUpgrade, Pending)> {
    headers.get(header::UPGRADE)?;
    if !list_elements(headers, header::CONNECTION).any(|c| c.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    let (sender, receiver) = oneshot::channel();
    Some((
        OnUpgrade(Arc::new(Mutex::new(Some(receiver)))),
        Pending(sender),
    ))
}

/// The `101`'s head as the service gave it: its fields, `Connection` and `Upgrade` included,
/// and a `date`.
pub(super) fn switching_head(headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\n");
    crate::http1::encode::write_fields(&mut out, headers.iter());
    if !headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        super::head::with_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Whether a response switches protocols.
pub(super) fn switches(status: StatusCode) -> bool {
    status == StatusCode::SWITCHING_PROTOCOLS
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn fields(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn an_upgrade_is_asked_for_by_upgrade_named_in_connection() {
        let asked = fields(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert!(requested(&asked).is_some());
        assert!(requested(&fields(&[("upgrade", "websocket")])).is_none());
        assert!(requested(&fields(&[("connection", "upgrade")])).is_none());
    }

    #[tokio::test]
    async fn the_connection_reads_its_read_ahead_first_and_is_taken_once() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let (on, pending) =
            requested(&fields(&[("connection", "upgrade"), ("upgrade", "x")])).expect("asked");
        let waiting = on.take().expect("the first take");
        assert!(on.clone().take().is_none(), "taken once");
        pending.hand_over(Upgraded::new(Box::new(ours), Bytes::from_static(b"ahead ")));
        let mut upgraded = waiting.await.expect("handed over");
        theirs.write_all(b"then the socket").await.unwrap();
        drop(theirs);
        let mut got = Vec::new();
        upgraded.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ahead then the socket");
    }

    #[test]
    fn the_switching_head_keeps_the_services_fields() {
        let head = switching_head(&fields(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("date", "Sun, 06 Dec 2026 06:00:00 GMT"),
        ]));
        let text = String::from_utf8(head).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
             date: Sun, 06 Dec 2026 06:00:00 GMT\r\n\r\n"
        );
    }
}
