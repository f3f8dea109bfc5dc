//! Small vectored writes joined into one slice before they reach rustls.
//!
//! The HTTP/1.1 servers (the native one and hyper's) write a chunked frame as one vectored write of
//! three slices (the chunk's size line, the frame, the CRLF), and hyper's HTTP/2 a DATA frame of 256 bytes or more as two (the frame
//! header and the payload; h2 copies smaller ones into its own buffer). rustls's `write_vectored` collects the slices into a `Vec`
//! before it encrypts them into a record: an allocation per frame on top of the record's own
//! buffer. [`JoinedWrites`] copies the slices of a write of at most [`JOIN_MAX`] bytes into a
//! buffer on the stack and hands rustls the one slice, which it takes without that `Vec`. The copy
//! is a few hundred bytes, less than the allocation and its free; rustls copies the plaintext into
//! the record either way. Larger writes go through as they are.

// Slices over a stack buffer; each block says why it is sound.
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest write joined on the stack: several chat frames (hyper may hand over a few at once).
pub const JOIN_MAX: usize = 4096;

/// An IO whose small vectored writes reach the inner IO as one slice (see the module).
#[derive(Debug)]
pub struct JoinedWrites<T> {
    inner: T,
}

// === impl JoinedWrites ===

impl<T> JoinedWrites<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        JoinedWrites { inner }
    }

    /// The wrapped IO.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JoinedWrites<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JoinedWrites<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total = bufs.iter().map(|b| b.len()).sum::<usize>();
        if bufs.len() < 2 || total > JOIN_MAX {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        // Uninitialised, so that a write of 300 bytes does not first zero 4 KiB.
        let mut joined = [MaybeUninit::<u8>::uninit(); JOIN_MAX];
        let mut end = 0;
        for buf in bufs {
            // SAFETY: the slices add up to `total` <= JOIN_MAX bytes, so each copy stays inside
            // `joined`, which overlaps no slice of the caller's.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buf.as_ptr(),
                    joined.as_mut_ptr().add(end).cast::<u8>(),
                    buf.len(),
                );
            }
            end += buf.len();
        }
        // SAFETY: the first `end` bytes were written just above.
        let joined = unsafe { std::slice::from_raw_parts(joined.as_ptr().cast::<u8>(), end) };
        // A write takes a prefix of the bytes, as a vectored write takes a prefix of the slices'.
        Pin::new(&mut self.inner).poll_write(cx, joined)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Takes at most `room` bytes per call and records how it was called.
    #[derive(Default)]
    struct Sink {
        room: usize,
        bytes: Vec<u8>,
        plain_writes: usize,
        vectored_writes: usize,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.room);
            self.bytes.extend_from_slice(&buf[..n]);
            self.plain_writes += 1;
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut n = 0;
            for buf in bufs {
                let take = buf.len().min(self.room - n);
                self.bytes.extend_from_slice(&buf[..take]);
                n += take;
            }
            self.vectored_writes += 1;
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn write_vectored(io: &mut JoinedWrites<Sink>, slices: &[&[u8]]) -> usize {
        let bufs: Vec<IoSlice<'_>> = slices.iter().map(|s| IoSlice::new(s)).collect();
        io.write_vectored(&bufs).await.unwrap()
    }

    #[tokio::test]
    async fn a_chunked_frame_reaches_the_inner_io_as_one_slice() {
        let mut io = JoinedWrites::new(Sink {
            room: usize::MAX,
            ..Sink::default()
        });
        let frame = [b'x'; 250];
        let n = write_vectored(&mut io, &[b"fa\r\n", &frame, b"\r\n"]).await;
        assert_eq!(n, 256);
        let sink = io.get_ref();
        assert_eq!((sink.plain_writes, sink.vectored_writes), (1, 0));
        assert_eq!(&sink.bytes[..4], b"fa\r\n");
        assert_eq!(&sink.bytes[4..254], &frame[..]);
        assert_eq!(&sink.bytes[254..], b"\r\n");
    }

    #[tokio::test]
    async fn a_write_the_inner_io_takes_in_part_reports_the_part() {
        let mut io = JoinedWrites::new(Sink {
            room: 10,
            ..Sink::default()
        });
        let n = write_vectored(&mut io, &[b"abcdef", b"ghijkl"]).await;
        assert_eq!(n, 10);
        assert_eq!(io.get_ref().bytes, b"abcdefghij");
    }

    #[tokio::test]
    async fn one_slice_and_large_writes_go_through_as_they_are() {
        let mut io = JoinedWrites::new(Sink {
            room: usize::MAX,
            ..Sink::default()
        });
        let large = vec![b'y'; JOIN_MAX];
        assert_eq!(write_vectored(&mut io, &[b"only"]).await, 4);
        assert_eq!(
            write_vectored(&mut io, &[b"1\r\n", &large]).await,
            JOIN_MAX + 3
        );
        assert_eq!(
            write_vectored(&mut io, &[b"ab", &large[..JOIN_MAX - 2]]).await,
            JOIN_MAX
        );
        let sink = io.get_ref();
        // The one slice and the write over the limit go through as they came; the largest write
        // that fits is joined.
        assert_eq!((sink.plain_writes, sink.vectored_writes), (1, 2));
        assert_eq!(sink.bytes.len(), 4 + JOIN_MAX + 3 + JOIN_MAX);
    }
}
