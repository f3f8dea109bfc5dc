//! The tunnels open on one listener, so the drain can close them, and the two metric families
//! that count them.
//!
//! A tunnel outlives the HTTP/1.1 connection it came on (that connection's server is done once
//! the `101` is out), so the listener's drain cannot reach it through the connection. Each
//! tunnel registers its own stop signal here; when the drain grace is over the listener tells
//! every tunnel to close, and each writes a `1001` close frame to both ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use crate::poison::LockExt;

/// How a tunnel ended: the `outcome` label of `metronome_websocket_connections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both ends sent a close frame (the closing handshake), then a socket closed.
    Completed,
    /// The client's socket closed (or broke) without the closing handshake.
    ClientClosed,
    /// The upstream's socket closed (or broke) without the closing handshake.
    UpstreamClosed,
    /// No byte either way for `timeouts.websocket_idle`: metronome closed it with `1001`.
    IdleTimeout,
    /// Open when the drain grace ran out: metronome closed it with `1001`.
    Drained,
    /// The upstream answered the upgrade with something other than `101`.
    UpstreamRefused,
    /// The upstream could not be reached, or an upgraded connection was lost before the tunnel
    /// began.
    Error,
}

// === impl Outcome ===

impl Outcome {
    /// Every outcome, for the metric's series.
    pub const ALL: [Outcome; 7] = [
        Outcome::Completed,
        Outcome::ClientClosed,
        Outcome::UpstreamClosed,
        Outcome::IdleTimeout,
        Outcome::Drained,
        Outcome::UpstreamRefused,
        Outcome::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::ClientClosed => "client_closed",
            Outcome::UpstreamClosed => "upstream_closed",
            Outcome::IdleTimeout => "idle_timeout",
            Outcome::Drained => "drained",
            Outcome::UpstreamRefused => "upstream_refused",
            Outcome::Error => "error",
        }
    }
}

/// `metronome_websocket_connections_total{route,outcome}` and
/// `metronome_websocket_connections_active{route}`.
#[derive(Debug, Clone)]
pub struct TunnelMetrics {
    /// Tunnels (and upgrades that did not become one) by how they ended.
    pub connections: IntCounterVec,
    /// Tunnels open now.
    pub active: IntGaugeVec,
}

// === impl TunnelMetrics ===

impl TunnelMetrics {
    /// The two families, registered with `metrics`.
    pub fn register(metrics: &crate::metrics::Metrics) -> prometheus::Result<Self> {
        let connections = IntCounterVec::new(
            Opts::new(
                "metronome_websocket_connections_total",
                "WebSocket upgrades by how they ended: completed, client_closed, upstream_closed, idle_timeout, drained, upstream_refused (no 101), error.",
            ),
            &["route", "outcome"],
        )?;
        let active = IntGaugeVec::new(
            Opts::new(
                "metronome_websocket_connections_active",
                "WebSocket tunnels open now.",
            ),
            &["route"],
        )?;
        metrics.register(Box::new(connections.clone()))?;
        metrics.register(Box::new(active.clone()))?;
        Ok(TunnelMetrics {
            connections,
            active,
        })
    }

    /// Counts an upgrade or tunnel that ended. The route's gauge of open tunnels shows from its
    /// first upgrade on, at 0 when none is open.
    pub fn ended(&self, route: &str, outcome: Outcome) {
        self.active.with_label_values(&[route]);
        self.connections
            .with_label_values(&[route, outcome.as_str()])
            .inc();
    }
}

/// One tunnel's request to close.
#[derive(Debug, Default)]
pub struct StopSignal {
    stop: AtomicBool,
    waker: AtomicWaker,
}

// === impl StopSignal ===

impl StopSignal {
    /// Whether the tunnel is asked to close; registers `waker` first, so a stop set after this
    /// call wakes it.
    pub fn stopped(&self, waker: &std::task::Waker) -> bool {
        self.waker.register(waker);
        self.stop.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// The tunnels open on one listener.
#[derive(Debug, Default)]
pub struct Tunnels {
    open: Mutex<HashMap<u64, Weak<StopSignal>>>,
    next: AtomicU64,
    /// Set once the drain grace is over: a tunnel that opens now closes at once.
    closing: AtomicBool,
    /// Told when the last tunnel closes.
    all_closed: tokio::sync::Notify,
}

/// A tunnel's place in [`Tunnels`], given back when dropped.
#[derive(Debug)]
pub struct Registered {
    tunnels: Arc<Tunnels>,
    id: u64,
    /// The tunnel's stop signal.
    pub signal: Arc<StopSignal>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.tunnels.open.lock_or_recover();
        open.remove(&self.id);
        if open.is_empty() {
            self.tunnels.all_closed.notify_waiters();
        }
    }
}

// === impl Tunnels ===

impl Tunnels {
    /// Registers a new tunnel.
    pub fn register(self: &Arc<Self>) -> Registered {
        let signal = Arc::new(StopSignal::default());
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock_or_recover()
            .insert(id, Arc::downgrade(&signal));
        if self.closing.load(Ordering::Acquire) {
            signal.stop();
        }
        Registered {
            tunnels: self.clone(),
            id,
            signal,
        }
    }

    /// Tunnels open now.
    pub fn len(&self) -> usize {
        self.open.lock_or_recover().len()
    }

    /// True when no tunnel is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once no tunnel is open.
    pub async fn closed(&self) {
        loop {
            let closed = self.all_closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.is_empty() {
                return;
            }
            closed.await;
        }
    }

    /// Tells every tunnel to close (a `1001` to both ends) and waits for them, at most `within`.
    pub async fn close_all(&self, within: Duration) {
        self.closing.store(true, Ordering::Release);
        let signals: Vec<_> = self
            .open
            .lock_or_recover()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for signal in signals {
            signal.stop();
        }
        let _ = tokio::time::timeout(within, self.closed()).await;
    }
}
