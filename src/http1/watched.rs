//! The socket and answer wrappers that tell a connection's head clock what happens on it: bytes
//! arrived ([`WatchedIo`]) and an answer is over ([`WatchedBody`], taken to its end or dropped).
//! The proxy's hyper connections (`proxy::head_deadline`) and the admin listener's
//! (`admin::connection`) each keep their own clock and deadline rule; what reports to the clock
//! is this one piece, generic over the clock ([`ConnectionWatch`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a connection's clock is told by the wrappers of this module.
pub trait ConnectionWatch {
    /// The socket gave bytes.
    fn read(&self);
    /// An answer was taken to its end, or dropped.
    fn answered(&self);
}

pin_project_lite::pin_project! {
    /// The connection's socket, telling `watch` when bytes arrive.
    pub struct WatchedIo<T, W> {
        #[pin]
        io: T,
        watch: Arc<W>,
    }
}

impl<T, W> WatchedIo<T, W> {
    /// `io` watched by `watch`.
    pub fn new(io: T, watch: Arc<W>) -> Self {
        WatchedIo { io, watch }
    }
}

impl<T: AsyncRead, W: ConnectionWatch> AsyncRead for WatchedIo<T, W> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.watch.read();
        }
        polled
    }
}

impl<T: AsyncWrite, W> AsyncWrite for WatchedIo<T, W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, telling `watch` when it is over (taken to its end or dropped).
    pub struct WatchedBody<B, W: ConnectionWatch> {
        #[pin]
        body: B,
        watch: Option<Arc<W>>,
    }

    impl<B, W: ConnectionWatch> PinnedDrop for WatchedBody<B, W> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(watch) = this.project().watch.take() {
                watch.answered();
            }
        }
    }
}

impl<B, W: ConnectionWatch> WatchedBody<B, W> {
    /// `body`, answering a request on the connection `watch` watches.
    pub fn new(body: B, watch: Arc<W>) -> Self {
        WatchedBody {
            body,
            watch: Some(watch),
        }
    }
}

impl<B: Body<Data = Bytes>, W: ConnectionWatch> Body for WatchedBody<B, W> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
