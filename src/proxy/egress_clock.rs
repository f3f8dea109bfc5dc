//! The egress clock: stamps a frame when its bytes reach the client connection's socket.
//!
//! Handing a frame to the serving connection (the native HTTP/1.1 server or hyper's) is not
//! delivery: the connection buffers, and a slow client leaves bytes waiting in it and the kernel.
//! So the accepted connection's IO is wrapped in [`EgressIo`], which counts the bytes each write
//! puts into the socket. When the egress body hands the connection a frame of
//! `len` bytes, it registers it with the connection's [`EgressClock`] at a threshold of bytes
//! written: the first write that crosses it stamps the frame. On HTTP/1.x frames go out in
//! hand-off order, so a frame's threshold is the previous frame's (or the bytes written so far,
//! if more) plus `len`: a frame handed over behind others still waiting is out only once their
//! bytes are too, and the stamp falls in the very write that carries the frame's last bytes (the
//! few bytes of the head and the chunk framing make it at most that much early on a partial
//! write). On HTTP/2 streams interleave, so the threshold is the bytes written so far plus `len`,
//! and bytes of other streams count too: a stamp can only be early, never late. One clock read
//! per socket write.
//!
//! The clock also tells the connection's metered streams when the socket refuses a write: the
//! connection stops polling their bodies until it drains, so their reader tasks must read the upstream
//! meanwhile (see `metered`).
//!
//! Until a stream's first token event, a frame its egress body read itself is handed over before
//! it is metered ([`Deferred`]): its events are classified after the write that carries it, so
//! the scan and the classification are not between the upstream's bytes and the client's socket.
//! Once the frame is out, the clock has the stream meter and stamp it, with the clock's own lock
//! released (the stream's lock is taken before the clock's when a frame is handed over).

use crate::poison::LockExt;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metering::clock::{FrameStamp, Tick};
use crate::metering::ledger::StreamLedger;

/// A frame handed to the serving connection, waiting for its bytes to reach the socket.
struct PendingFrame {
    /// Socket byte count at which the frame is out.
    threshold: u64,
    /// The frame's ingress stamp (without counts when `Deferred`).
    stamp: FrameStamp,
    stream: Stamped,
}

/// Who takes a frame's egress stamp.
enum Stamped {
    /// The stream's ledger: the frame was metered before it was handed over.
    Metered(Arc<StreamLedger>),
    /// The stream, which meters the frame once it is out, then stamps it.
    Deferred(Arc<dyn Deferred>),
}

impl std::fmt::Debug for PendingFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFrame")
            .field("threshold", &self.threshold)
            .field("stamp", &self.stamp)
            .field("deferred", &matches!(self.stream, Stamped::Deferred(_)))
            .finish_non_exhaustive()
    }
}

/// A metered stream whose frames are handed to the connection before they are metered.
pub trait Deferred: Send + Sync {
    /// The oldest of the stream's frames handed over unmetered is out, at `at` in socket write
    /// `write_seq`: meter it (unless the stream already had to) and give its ledger the egress
    /// stamp. `ingress` is its ingress stamp without counts. Frames come out in the order they
    /// were handed over.
    fn metered_out(&self, ingress: FrameStamp, at: Tick, write_seq: u64);
}

/// A metered stream that reads its upstream from its egress body while the client keeps up and
/// must be told when the socket refuses a write.
pub trait Standby: Send + Sync {
    /// The client's socket refused a write: the connection will not poll the body until it drains.
    fn client_blocked(self: Arc<Self>);
}

/// Per-connection count of bytes written to the client socket and the frames waiting for it.
#[derive(Default)]
pub struct EgressClock {
    /// Bytes the socket has accepted so far.
    written: AtomicU64,
    /// Socket writes so far: frames stamped in one write share it (events per write).
    writes: AtomicU64,
    /// Frames waiting, in hand-off order. Only this connection's streams touch it.
    pending: Mutex<VecDeque<PendingFrame>>,
    /// `pending.len()`, readable without the lock: most writes find nothing to stamp.
    pending_len: AtomicUsize,
    /// The connection's IO is gone: no frame handed over now will ever be out.
    closed: AtomicBool,
    /// The threshold of the last frame handed over in order (HTTP/1.x).
    last_in_order: AtomicU64,
    /// Streams to tell when the socket refuses a write (HTTP/1.x: at most a few, mostly ended).
    standby: Mutex<Vec<Weak<dyn Standby>>>,
}

impl std::fmt::Debug for EgressClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressClock")
            .field("written", &self.written)
            .field("writes", &self.writes)
            .field("pending_len", &self.pending_len)
            .finish_non_exhaustive()
    }
}

// === impl EgressClock ===

impl EgressClock {
    /// A clock for a new connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// The egress body handed the connection a frame of `len` bytes, metered (`stamp` has its
    /// counts); `in_order`: the connection writes its frames in hand-off order (HTTP/1.x).
    pub fn handoff(
        &self,
        len: usize,
        ledger: &Arc<StreamLedger>,
        stamp: FrameStamp,
        in_order: bool,
    ) {
        self.push(len, stamp, Stamped::Metered(ledger.clone()), in_order);
    }

    /// The egress body handed the connection a frame of `len` bytes that `stream` meters once
    /// it is out (HTTP/1.x only: its frames come out in hand-off order).
    pub fn handoff_deferred(&self, len: usize, ingress: FrameStamp, stream: Arc<dyn Deferred>) {
        // The stream holds this clock: a frame queued after the IO is gone would keep both alive.
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        self.push(len, ingress, Stamped::Deferred(stream), true);
    }

    fn push(&self, len: usize, stamp: FrameStamp, stream: Stamped, in_order: bool) {
        let written = self.written.load(Ordering::Acquire);
        let threshold = if in_order {
            // Only the connection's own task hands frames over on HTTP/1.x.
            let after = self.last_in_order.load(Ordering::Relaxed).max(written) + len as u64;
            self.last_in_order.store(after, Ordering::Relaxed);
            after
        } else {
            written + len as u64
        };
        let mut pending = self.pending.lock_or_recover();
        pending.push_back(PendingFrame {
            threshold,
            stamp,
            stream,
        });
        self.pending_len.store(pending.len(), Ordering::Release);
    }

    /// The socket accepted `n` more bytes: stamp every frame that is now out.
    fn wrote(&self, n: usize) {
        let total = self.written.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
        if n == 0 || self.pending_len.load(Ordering::Acquire) == 0 {
            return;
        }
        let write_seq = self.writes.fetch_add(1, Ordering::Relaxed);
        let now = Tick::now();
        let mut pending = self.pending.lock_or_recover();
        // Thresholds rise in hand-off order on HTTP/1.1: the frames out are at the front.
        while pending.front().is_some_and(|f| f.threshold <= total) {
            let Some(frame) = pending.pop_front() else {
                break;
            };
            match frame.stream {
                Stamped::Metered(ledger) => ledger.egress_frame(now, write_seq, &frame.stamp),
                Stamped::Deferred(stream) => {
                    // Metering takes the stream's lock, which is taken before this one when a
                    // frame is handed over: let go of this one meanwhile.
                    drop(pending);
                    stream.metered_out(frame.stamp, now, write_seq);
                    drop(stream);
                    pending = self.pending.lock_or_recover();
                }
            }
        }
        // On HTTP/2 streams interleave: a frame behind one that is not out may be (never a
        // deferred one, which only HTTP/1.x hands over).
        if pending.iter().any(|f| f.threshold <= total) {
            pending.retain(|frame| match &frame.stream {
                Stamped::Metered(ledger) if frame.threshold <= total => {
                    ledger.egress_frame(now, write_seq, &frame.stamp);
                    false
                }
                _ => true,
            });
        }
        self.pending_len.store(pending.len(), Ordering::Release);
    }

    /// The connection's IO is gone: the frames still waiting will never be out. Lets go of
    /// them, and of the streams their metering would have needed.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let frames = {
            let mut pending = self.pending.lock_or_recover();
            self.pending_len.store(0, Ordering::Release);
            std::mem::take(&mut *pending)
        };
        drop(frames);
    }

    /// Asks for the clock's own cache lines, which the frame's hand-off and stamp will touch
    /// (see [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        crate::prefetch::value(self);
    }

    /// Bytes written to the socket so far.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Tells `stream` when the socket refuses a write, for as long as it lives.
    pub fn register(&self, stream: Weak<dyn Standby>) {
        let mut standby = self.standby.lock_or_recover();
        standby.retain(|s| s.strong_count() > 0);
        standby.push(stream);
    }

    /// The socket refused a write: tell the streams still open.
    fn blocked(&self) {
        let streams: Vec<_> = {
            let standby = self.standby.lock_or_recover();
            standby.iter().filter_map(Weak::upgrade).collect()
        };
        for stream in streams {
            stream.client_blocked();
        }
    }
}

pin_project_lite::pin_project! {
    /// The accepted connection's IO, counting what each write puts into the socket.
    #[derive(Debug)]
    pub struct EgressIo<T> {
        #[pin]
        inner: T,
        clock: Arc<EgressClock>,
    }

    impl<T> PinnedDrop for EgressIo<T> {
        fn drop(this: Pin<&mut Self>) {
            this.project().clock.close();
        }
    }
}

// === impl EgressIo ===

impl<T> EgressIo<T> {
    /// Wraps a connection's IO; `clock` is shared with the connection's egress bodies.
    pub fn new(inner: T, clock: Arc<EgressClock>) -> Self {
        EgressIo { inner, clock }
    }
}

impl<T: AsyncRead> AsyncRead for EgressIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: AsyncWrite> AsyncWrite for EgressIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write(cx, buf);
        match result {
            Poll::Ready(Ok(n)) => this.clock.wrote(n),
            Poll::Pending => this.clock.blocked(),
            Poll::Ready(Err(_)) => {}
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write_vectored(cx, bufs);
        match result {
            Poll::Ready(Ok(n)) => this.clock.wrote(n),
            Poll::Pending => this.clock.blocked(),
            Poll::Ready(Err(_)) => {}
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that records when each of its frames is out.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(Tick, u64)>>);

    impl Deferred for Recorder {
        fn metered_out(&self, ingress: FrameStamp, _at: Tick, write_seq: u64) {
            self.0.lock_or_recover().push((ingress.ingress, write_seq));
        }
    }

    fn read_at(nanos: i64) -> FrameStamp {
        FrameStamp::unmetered(
            Tick::default().saturating_add(std::time::Duration::from_nanos(nanos as u64)),
        )
    }

    #[test]
    fn a_deferred_frame_is_metered_once_its_last_byte_is_out_in_hand_off_order() {
        let clock = EgressClock::new();
        let stream = Arc::new(Recorder::default());
        let (first, second, third) = (read_at(1), read_at(2), read_at(3));
        clock.handoff_deferred(10, first, stream.clone());
        clock.wrote(9);
        assert!(
            stream.0.lock_or_recover().is_empty(),
            "one byte still waits"
        );
        clock.wrote(1);
        clock.handoff_deferred(5, second, stream.clone());
        clock.handoff_deferred(4, third, stream.clone());
        clock.wrote(4);
        assert_eq!(stream.0.lock_or_recover().len(), 1, "the second is not out");
        clock.wrote(5); // the second and the third frame in one write
        let out = stream.0.lock_or_recover().clone();
        assert_eq!(
            out,
            vec![(first.ingress, 1), (second.ingress, 3), (third.ingress, 3)],
            "each in the write that carried its last byte, in order"
        );
        assert_eq!(Arc::strong_count(&stream), 1, "no frame keeps the stream");
    }

    #[test]
    fn on_http1_a_frame_behind_others_is_out_only_after_their_bytes() {
        let clock = EgressClock::new();
        let stream = Arc::new(Recorder::default());
        let (first, second) = (read_at(1), read_at(2));
        // Both handed over before any write, as a batch of frames is.
        clock.handoff_deferred(10, first, stream.clone());
        clock.handoff_deferred(5, second, stream.clone());
        clock.wrote(12);
        assert_eq!(
            *stream.0.lock_or_recover(),
            vec![(first.ingress, 0)],
            "the second frame's bytes are not all out after 12 of 15"
        );
        clock.wrote(3);
        assert_eq!(stream.0.lock_or_recover().len(), 2);
    }

    #[test]
    fn a_closed_clock_lets_go_of_waiting_frames_and_takes_no_more() {
        let clock = EgressClock::new();
        let stream = Arc::new(Recorder::default());
        clock.handoff_deferred(10, read_at(1), stream.clone());
        assert_eq!(Arc::strong_count(&stream), 2);
        clock.close();
        assert_eq!(
            Arc::strong_count(&stream),
            1,
            "the waiting frame let go of it"
        );
        clock.handoff_deferred(10, read_at(2), stream.clone());
        assert_eq!(
            Arc::strong_count(&stream),
            1,
            "nothing queued after the close"
        );
        clock.wrote(20);
        assert!(stream.0.lock_or_recover().is_empty(), "never out");
    }
}
