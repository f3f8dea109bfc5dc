//! The idle upstream connections of one worker, kept for reuse for `timeouts.upstream_idle`.
//!
//! A connection comes back here only after a response that ended cleanly with nothing after it,
//! and is handed out again only if the upstream has not closed it meanwhile (a read that would
//! block says it is open). A task sweeps out connections idle longer than the timeout, so a
//! burst's connections do not stay open on the inference server after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::net::TcpStream;

/// An open HTTP/1.1 connection to an upstream, with what has been read from it and not yet used.
#[derive(Debug)]
pub struct UpstreamConnection {
    /// The socket.
    pub io: TcpStream,
    /// Bytes read and not yet decoded.
    pub buf: BytesMut,
}

/// A connection waiting in the pool.
#[derive(Debug)]
struct Idle {
    conn: UpstreamConnection,
    since: Instant,
}

/// The idle connections by upstream authority (`host:port`), most recently used last.
#[derive(Debug, Default)]
struct Idles {
    by_authority: HashMap<Arc<str>, Vec<Idle>>,
    /// A sweeper task is running.
    sweeping: bool,
}

/// A pool of idle upstream connections, shared by the requests of one worker.
#[derive(Debug, Clone)]
pub struct Pool {
    idles: Arc<Mutex<Idles>>,
    idle_timeout: Duration,
}

// === impl Pool ===

impl Pool {
    /// An empty pool whose connections are closed after `idle_timeout` unused.
    pub fn new(idle_timeout: Duration) -> Self {
        Pool {
            idles: Arc::new(Mutex::new(Idles::default())),
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Idles> {
        lock(&self.idles)
    }

    /// The most recently used idle connection to `authority` that is still open and not expired.
    pub fn checkout(&self, authority: &str) -> Option<UpstreamConnection> {
        let now = Instant::now();
        let mut idles = self.lock();
        let list = idles.by_authority.get_mut(authority)?;
        while let Some(idle) = list.pop() {
            if now.duration_since(idle.since) < self.idle_timeout && is_open(&idle.conn.io) {
                return Some(idle.conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to `authority`.
    pub fn checkin(&self, authority: Arc<str>, conn: UpstreamConnection) {
        let mut idles = self.lock();
        idles.by_authority.entry(authority).or_default().push(Idle {
            conn,
            since: Instant::now(),
        });
        if !idles.sweeping {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                idles.sweeping = true;
                runtime.spawn(sweep(Arc::downgrade(&self.idles), self.idle_timeout));
            }
        }
    }

    /// How many idle connections the pool holds.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.lock().by_authority.values().map(Vec::len).sum()
    }
}

/// The idle connections, poisoned or not: a panic while they were held leaves each list whole
/// (the policy of `crate::poison`, which this wire layer does not depend on).
fn lock(idles: &Mutex<Idles>) -> std::sync::MutexGuard<'_, Idles> {
    idles.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the upstream has left `io` open: a read finds nothing to read (it would block). A
/// closed connection reads its end, an error, or bytes nobody asked for; all are unusable.
fn is_open(io: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Closes connections idle for `idle_timeout`, until the pool is empty or gone.
async fn sweep(idles: Weak<Mutex<Idles>>, idle_timeout: Duration) {
    let mut next = idle_timeout;
    loop {
        tokio::time::sleep(next).await;
        let Some(idles) = idles.upgrade() else { return };
        let mut idles = lock(&idles);
        let now = Instant::now();
        let mut oldest: Option<Instant> = None;
        idles.by_authority.retain(|_, list| {
            list.retain(|idle| now.duration_since(idle.since) < idle_timeout);
            if let Some(first) = list.first() {
                oldest = Some(oldest.map_or(first.since, |o| o.min(first.since)));
            }
            !list.is_empty()
        });
        match oldest {
            // Wake when the oldest left expires (never sooner than a millisecond from now).
            Some(oldest) => {
                next = (oldest + idle_timeout)
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1));
            }
            None => {
                idles.sweeping = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A connected pair: the pool's side and the upstream's side.
    async fn pair() -> (UpstreamConnection, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let conn = UpstreamConnection {
            io: client.unwrap(),
            buf: BytesMut::new(),
        };
        (conn, accepted.unwrap().0)
    }

    #[tokio::test]
    async fn an_idle_connection_is_handed_out_again_most_recent_first() {
        let pool = Pool::new(Duration::from_secs(30));
        let (a, _upstream_a) = pair().await;
        let (b, _upstream_b) = pair().await;
        let b_port = b.io.local_addr().unwrap().port();
        pool.checkin(Arc::from("up:80"), a);
        pool.checkin(Arc::from("up:80"), b);
        assert!(pool.checkout("other:80").is_none());
        let first = pool.checkout("up:80").unwrap();
        assert_eq!(first.io.local_addr().unwrap().port(), b_port);
        assert!(pool.checkout("up:80").is_some());
        assert!(pool.checkout("up:80").is_none());
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_or_wrote_to_is_not_handed_out() {
        let pool = Pool::new(Duration::from_secs(30));
        let (closed, upstream) = pair().await;
        drop(upstream);
        let (chatty, mut upstream) = pair().await;
        upstream
            .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
            .await
            .unwrap();
        let (open, _upstream) = pair().await;
        pool.checkin(Arc::from("up:80"), open);
        pool.checkin(Arc::from("up:80"), closed);
        pool.checkin(Arc::from("up:80"), chatty);
        // Let the close and the bytes arrive.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.checkout("up:80").is_some(), "the open one");
        assert!(pool.checkout("up:80").is_none());
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let pool = Pool::new(Duration::from_millis(100));
        let (conn, mut upstream) = pair().await;
        pool.checkin(Arc::from("up:80"), conn);
        assert_eq!(pool.idle_count(), 1);
        // The upstream sees the close without any further request.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read(&mut upstream, &mut byte),
        )
        .await
        .expect("closed within the timeout's margin");
        assert_eq!(read.unwrap(), 0);
        assert_eq!(pool.idle_count(), 0);
        assert!(
            !pool.lock().sweeping,
            "the sweeper stops with the pool empty"
        );
    }
}
