//! A request head's own deadline on hyper's HTTP/1 connections (`server.http1_server =
//! "hyper"`): `timeouts.client_head` from the head's first byte, as the native server keeps it.
//!
//! hyper's `header_read_timeout` starts when the connection is ready for a head, so one timer
//! covers both the wait for the next request and the reading of its head; it stays at
//! `timeouts.client_idle` (300 s, longer than the keep-alive of whatever sits in front), and
//! without this a head begun and never finished held its connection and bytes that long.
//! [`HeadClock`] is told when bytes arrive ([`ClockedIo`]), when a whole head reached the
//! service ([`HeadClock::answering`]) and when the answer is over ([`Answered`]);
//! [`HeadDeadline`] ends the connection once a head has been in progress for longer than the
//! bound. Everything happens in the connection's own task, so the deadline is checked after
//! every poll of the connection, with no notification between tasks.
//!
//! Bytes that arrive while an answer is written (a request body, a pipelined head) start no
//! clock: a head that follows them is bounded by hyper's `client_idle` only.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Whether a connection is in the middle of a request head, and since when.
#[derive(Debug)]
pub struct HeadClock {
    /// When the head in progress began, in nanoseconds since `born`, plus one; 0: none.
    head_since: AtomicU64,
    /// A whole head reached the service and its answer is not over yet.
    answering: AtomicBool,
    born: Instant,
}

// === impl HeadClock ===

impl HeadClock {
    /// A connection just accepted, waiting for its first head.
    pub fn new() -> Arc<Self> {
        Arc::new(HeadClock {
            head_since: AtomicU64::new(0),
            answering: AtomicBool::new(false),
            born: Instant::now(),
        })
    }

    /// The socket gave bytes: the first of a head starts its clock.
    fn read(&self) {
        if !self.answering.load(Ordering::Relaxed) && self.head_since.load(Ordering::Relaxed) == 0 {
            let now = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            self.head_since.store(now + 1, Ordering::Relaxed);
        }
    }

    /// The service was called: the head is whole.
    pub fn answering(&self) {
        self.answering.store(true, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    /// The answer's body was taken to its end, or dropped.
    fn answered(&self) {
        self.answering.store(false, Ordering::Relaxed);
    }

    /// When the head in progress runs out of time, if one is in progress.
    fn deadline(&self, bound: Duration) -> Option<Instant> {
        match self.head_since.load(Ordering::Relaxed) {
            0 => None,
            since => Some(self.born + Duration::from_nanos(since - 1) + bound),
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection that ends once a request head has taken longer than its bound; dropping it
    /// closes the socket.
    pub struct HeadDeadline<C> {
        #[pin]
        conn: C,
        clock: Arc<HeadClock>,
        bound: Duration,
        // Armed while a head is in progress.
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<C> HeadDeadline<C> {
    /// `conn`, whose heads `clock` watches, ended when one takes longer than `bound`.
    pub fn new(conn: C, clock: Arc<HeadClock>, bound: Duration) -> Self {
        HeadDeadline {
            conn,
            clock,
            bound,
            sleep: None,
        }
    }

    /// The connection inside, to ask it for a graceful shutdown.
    pub fn conn(self: Pin<&mut Self>) -> Pin<&mut C> {
        self.project().conn
    }
}

impl<C: Future<Output = Result<(), E>>, E> Future for HeadDeadline<C> {
    type Output = Result<(), E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(done) = this.conn.poll(cx) {
            return Poll::Ready(done);
        }
        let Some(deadline) = this.clock.deadline(*this.bound) else {
            *this.sleep = None;
            return Poll::Pending;
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            tracing::debug!("a request head took longer than timeouts.client_head; closing");
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

/// The connection's socket, telling its [`HeadClock`] when bytes arrive.
pub type ClockedIo<T> = crate::http1::watched::WatchedIo<T, HeadClock>;

/// An answer's body, telling its [`HeadClock`] when it is over (taken to its end or dropped).
pub type Answered<B> = crate::http1::watched::WatchedBody<B, HeadClock>;

impl crate::http1::watched::ConnectionWatch for HeadClock {
    fn read(&self) {
        HeadClock::read(self);
    }

    fn answered(&self) {
        HeadClock::answered(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_timed_from_its_first_byte_until_it_reaches_the_service() {
        let clock = HeadClock::new();
        let bound = Duration::from_secs(10);
        assert_eq!(clock.deadline(bound), None, "no head yet");
        let before = Instant::now();
        clock.read();
        let deadline = clock.deadline(bound).unwrap();
        assert!(deadline >= before + bound && deadline <= Instant::now() + bound);
        clock.read();
        assert_eq!(clock.deadline(bound), Some(deadline), "from its first byte");
        clock.answering();
        assert_eq!(clock.deadline(bound), None);
        clock.read();
        assert_eq!(clock.deadline(bound), None, "a body read while answering");
        clock.answered();
        assert_eq!(clock.deadline(bound), None, "idle: client_idle's");
        clock.read();
        assert!(clock.deadline(bound).is_some(), "the next head");
    }
}
