//! One admin connection's life, bounded as the proxy listener bounds its own: a deadline for
//! each request head, one for the wait between requests (and for an answer the client does not
//! take), and the head's size (hyper's `max_header_size`, answered 431).
//!
//! hyper's own `header_read_timeout` starts when the connection is ready for a head, so it
//! would also be the keep-alive timeout; the two are told apart here. [`Watch`] is the
//! connection's phase, moved by the socket's reads ([`WatchedIo`]), the service's call and the
//! answer's end ([`WatchedBody`]); [`serve`] closes the connection once the phase's deadline has
//! passed. It sleeps towards the deadline and looks again when the sleep ends or a phase begins
//! (a few times per request, never per read).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::AdminConfig;

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Waiting for the first byte of a request: `admin.idle_timeout` (`head_timeout` before the
    /// first request, whose wait starts at the connection).
    Idle = 0,
    /// A head has begun: `admin.head_timeout` from its first byte.
    Head = 1,
    /// A request is being answered: `admin.idle_timeout`, for a client that does not read.
    Answering = 2,
}

/// A connection's phase and when it began, shared by its socket, its service and its answers.
#[derive(Debug)]
pub struct Watch {
    phase: AtomicU8,
    /// When the phase began, in nanoseconds since `born`.
    since: AtomicU64,
    /// Bytes arrived while an answer was being written (a pipelined head): the connection goes
    /// to `Head`, not `Idle`, when the answer ends.
    read_ahead: AtomicBool,
    /// Whether a request has been answered, so the first wait is a head's.
    served: AtomicBool,
    born: Instant,
    /// Wakes [`serve`] when a phase begins, whose deadline may be earlier than the one it sleeps
    /// towards.
    changed: tokio::sync::Notify,
}

// === impl Watch ===

impl Watch {
    /// A connection just accepted.
    pub fn new() -> Arc<Self> {
        Arc::new(Watch {
            phase: AtomicU8::new(Phase::Idle as u8),
            since: AtomicU64::new(0),
            read_ahead: AtomicBool::new(false),
            served: AtomicBool::new(false),
            born: Instant::now(),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn enter(&self, phase: Phase) {
        self.since.store(self.now(), Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.changed.notify_one();
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            1 => Phase::Head,
            2 => Phase::Answering,
            _ => Phase::Idle,
        }
    }

    /// The socket gave bytes.
    fn read(&self) {
        match self.phase() {
            // The first head's deadline runs from the connection, not from its first byte.
            Phase::Idle if !self.served.load(Ordering::Relaxed) => {
                self.phase.store(Phase::Head as u8, Ordering::Relaxed)
            }
            Phase::Idle => self.enter(Phase::Head),
            Phase::Answering => self.read_ahead.store(true, Ordering::Relaxed),
            Phase::Head => {}
        }
    }

    /// The service was called: a whole head arrived.
    pub fn answering(&self) {
        self.read_ahead.store(false, Ordering::Relaxed);
        self.enter(Phase::Answering);
    }

    /// An answer's body was taken to its end, or dropped.
    fn answered(&self) {
        self.served.store(true, Ordering::Relaxed);
        if self.read_ahead.swap(false, Ordering::Relaxed) {
            self.enter(Phase::Head);
        } else {
            self.enter(Phase::Idle);
        }
    }

    /// When the current phase runs out.
    fn deadline(&self, bounds: &AdminConfig) -> Instant {
        let allowed = match self.phase() {
            Phase::Idle if !self.served.load(Ordering::Relaxed) => bounds.head_timeout,
            Phase::Head => bounds.head_timeout,
            Phase::Idle | Phase::Answering => bounds.idle_timeout,
        };
        self.born + Duration::from_nanos(self.since.load(Ordering::Relaxed)) + allowed
    }
}

/// Drives `connection` until it ends or its phase's deadline passes; then it is dropped, which
/// closes the socket.
/// `permit` is the connection's place under `admin.max_connections`, given back when it ends.
pub async fn serve(
    connection: impl std::future::Future,
    watch: Arc<Watch>,
    bounds: AdminConfig,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _permit = permit;
    tokio::pin!(connection);
    loop {
        let deadline = watch.deadline(&bounds);
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = watch.changed.notified() => {}
            _ = tokio::time::sleep_until(deadline.into()) => {
                if watch.deadline(&bounds) <= Instant::now() {
                    tracing::debug!(phase = ?watch.phase(), "admin connection closed at its deadline");
                    return;
                }
            }
        }
    }
}

/// The connection's socket, telling its [`Watch`] when bytes arrive.
pub type WatchedIo<T> = crate::http1::watched::WatchedIo<T, Watch>;

/// An answer's body, telling its [`Watch`] when it is over (taken to its end or dropped).
pub type WatchedBody<B> = crate::http1::watched::WatchedBody<B, Watch>;

impl crate::http1::watched::ConnectionWatch for Watch {
    fn read(&self) {
        Watch::read(self);
    }

    fn answered(&self) {
        Watch::answered(self);
    }
}
