//! Clients that attack the proxy listener rather than use it, each against a real
//! in-process proxy on loopback: what they hold (descriptors, CPU) must go back to idle within the
//! configured bounds, and a legitimate client must still be answered.
//!
//! The tests here count this process's open descriptors and CPU time, so they take a lock and
//! run one at a time; every wait is bounded, and the CPU bound is generous (the bug it catches
//! spun two cores).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use metronome::config::ServerKind;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One test at a time: each counts the whole process's descriptors and CPU.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This process's open file descriptors.
fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's CPU time so far (user and system), from /proc/self/stat.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / USER_HZ)
}

/// The clock ticks per second of /proc's CPU times (USER_HZ: 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// `count` connections, `at_once` at a time, each sending `first` and then closing at once
/// (`close`) or staying open until the proxy closes it.
async fn flood(addr: SocketAddr, count: usize, at_once: usize, first: &'static [u8], close: bool) {
    let mut left = count;
    while left > 0 {
        let batch = left.min(at_once);
        left -= batch;
        let mut tasks = Vec::with_capacity(batch);
        for _ in 0..batch {
            tasks.push(tokio::spawn(async move {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    return;
                };
                let _ = tcp.write_all(first).await;
                if close {
                    let _ = tcp.shutdown().await;
                    return;
                }
                // Held open: the proxy must close it (read 0 or a reset), within the bound.
                let mut buf = [0u8; 256];
                let _ = tokio::time::timeout(Duration::from_secs(30), tcp.read(&mut buf)).await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }
}

/// Waits up to `limit` for the process's descriptors to fall to `at_most`; the count when it
/// gave up otherwise.
async fn descriptors_fall_to(at_most: usize, limit: Duration) -> Result<Duration, usize> {
    let began = Instant::now();
    loop {
        let now = descriptors();
        if now <= at_most {
            return Ok(began.elapsed());
        }
        if began.elapsed() > limit {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Thousands of "connect, send `P`, close" connections, then half-prefix connections held
/// open. A sniff that peeked each closed one every millisecond until
/// `timeouts.client_idle` (300 s here) would keep both cores busy and every descriptor held,
/// and answer the next client 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_clients_leave_no_descriptor_and_no_cpu_behind() {
    let _alone = ALONE.lock().await;
    const CLOSING: usize = 3000;
    const HOLDING: usize = 50;
    let upstream = Upstream::openai_chat().tokens(3).start().await;
    let proxy = proxy_with(upstream.addr, |config| {
        config.server.http1_server = ServerKind::Native;
        config.timeouts.sniff = Duration::from_secs(1);
        config.timeouts.client_idle = Duration::from_secs(300);
        config.limits.max_connections = 1000;
    })
    .await;
    let before = descriptors();

    flood(proxy.proxy_addr, CLOSING, 100, b"P", true).await;
    // Every connection closed by its client: the proxy sees each close at once, well within
    // the sniff deadline (1 s; 10 s allowed for a loaded machine).
    let fell = descriptors_fall_to(before + 16, Duration::from_secs(10)).await;
    assert!(
        fell.is_ok(),
        "descriptors: {before} before, {} after {CLOSING} one-byte clients",
        fell.unwrap_err()
    );
    let spent = cpu();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = cpu() - spent;
    assert!(
        idle < Duration::from_millis(400),
        "the idle proxy took {idle:?} of CPU in one second"
    );
    let answered = stream_chat(proxy.proxy_addr).await;
    assert_eq!(answered.status, 200);
    let metrics = scrape(&proxy).await;
    assert_eq!(metrics.value("metronome_sniff_timeouts_total", &[]), 0.0);

    // Half a preface, held open: closed by the proxy at the sniff deadline, and counted.
    let began = Instant::now();
    flood(proxy.proxy_addr, HOLDING, HOLDING, b"PR", false).await;
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "held connections closed after {:?}",
        began.elapsed()
    );
    let fell = descriptors_fall_to(before + 16, Duration::from_secs(10)).await;
    assert!(fell.is_ok(), "descriptors after held prefixes: {fell:?}");
    let metrics = scrape(&proxy).await;
    assert_eq!(
        metrics.value("metronome_sniff_timeouts_total", &[]),
        HOLDING as f64
    );
    assert_eq!(stream_chat(proxy.proxy_addr).await.status, 200);
    proxy.shutdown().await;
}

/// Relays one connection to `proxy`, its first `slow` bytes one at a time `gap` apart, the rest
/// as they come, both ways.
async fn trickling_relay(proxy: SocketAddr, slow: usize, gap: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let upstream = TcpStream::connect(proxy).await.unwrap();
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_proxy, mut to_proxy) = upstream.into_split();
        let mut first = vec![0u8; slow];
        if from_client.read_exact(&mut first).await.is_err() {
            return;
        }
        for byte in first {
            tokio::time::sleep(gap).await;
            if to_proxy.write_all(&[byte]).await.is_err() {
                return;
            }
        }
        let up = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from_client, &mut to_proxy).await;
            let _ = to_proxy.shutdown().await;
        });
        let _ = tokio::io::copy(&mut from_proxy, &mut to_client).await;
        let _ = to_client.shutdown().await;
        let _ = up.await;
    });
    addr
}

/// An HTTP/2 client with prior knowledge whose preface arrives a byte at a
/// time (24 segments, 20 ms apart) is still told apart and served, like one that sends it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_send_the_preface_slowly_are_served() {
    let _alone = ALONE.lock().await;
    const CLIENTS: usize = 8;
    let upstream = Upstream::openai_chat().tokens(3);
    let expected = Bytes::from(upstream.expected_bytes());
    let upstream = upstream.start().await;
    let proxy = proxy_with(upstream.addr, |config| {
        config.timeouts.sniff = Duration::from_secs(5);
    })
    .await;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let relay = trickling_relay(proxy.proxy_addr, 24, Duration::from_millis(20)).await;
        clients.push(tokio::spawn(async move {
            let tcp = TcpStream::connect(relay).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let request = http::Request::post(format!("http://{relay}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
                .unwrap();
            let response =
                tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
                    .await
                    .expect("an answer within 10 s")
                    .unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }));
    }
    for client in clients {
        let (status, body) = client.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, expected);
    }
    let metrics = scrape(&proxy).await;
    assert_eq!(metrics.value("metronome_sniff_timeouts_total", &[]), 0.0);
    proxy.shutdown().await;
}

/// A partial request head on the admin listener, held open: how long until the listener closed
/// it (read 0 or a reset), and whether it was first told 503 (over `admin.max_connections`);
/// `None` when it was still open after `limit`.
async fn partial_admin_head(admin: SocketAddr, limit: Duration) -> Option<(Duration, bool)> {
    let mut tcp = TcpStream::connect(admin).await.ok()?;
    let head = format!(
        "GET /metrics HTTP/1.1\r\nhost: x\r\nx-pad: {}",
        "a".repeat(1000)
    );
    let began = Instant::now();
    let _ = tcp.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout_at((began + limit).into(), tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
        }
    }
    Some((began.elapsed(), answer.starts_with(b"HTTP/1.1 503")))
}

/// 2,000 partial request heads on the admin listener at once: those beyond
/// `admin.max_connections` are told 503 at once, the rest closed at `admin.head_timeout`; the
/// proxy answers meanwhile, and every descriptor comes back. Before the admin listener had its
/// own bounds, all 2,000 were still open a minute later, and enough of them used up the
/// process's descriptors, the proxy's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_admin_heads_are_closed_at_the_head_timeout_and_the_proxy_answers() {
    let _alone = ALONE.lock().await;
    const HEADS: usize = 2000;
    let head_timeout = Duration::from_secs(1);
    let upstream = Upstream::openai_chat().tokens(3).start().await;
    let proxy = proxy_with(upstream.addr, |config| {
        config.admin.head_timeout = head_timeout;
        config.admin.max_connections = 128;
    })
    .await;
    let before = descriptors();
    let admin = proxy.admin_addr;
    let limit = Duration::from_secs(15);
    let heads: Vec<_> = (0..HEADS)
        .map(|_| tokio::spawn(partial_admin_head(admin, limit)))
        .collect();
    // The proxy answers while the admin listener is full.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(stream_chat(proxy.proxy_addr).await.status, 200);
    let mut slowest = Duration::ZERO;
    let (mut busy, mut open) = (0, 0);
    for head in heads {
        match head.await.unwrap() {
            Some((took, told_busy)) => {
                slowest = slowest.max(took);
                busy += usize::from(told_busy);
            }
            None => open += 1,
        }
    }
    println!("{HEADS} partial admin heads: {open} still open after {limit:?}, {busy} told 503, the last closed after {slowest:?}");
    assert_eq!(open, 0, "heads still open after {limit:?}");
    // Each closed within the head timeout of its connection (slot reuse and a loaded machine
    // aside: the margin is generous).
    assert!(
        slowest < head_timeout + Duration::from_secs(5),
        "{slowest:?}"
    );
    assert!(busy >= HEADS - 1000, "{busy} told 503");
    let fell = descriptors_fall_to(before + 16, Duration::from_secs(10)).await;
    assert!(fell.is_ok(), "descriptors: {before} before, {fell:?} after");
    let health = request(admin, "GET", "/healthz", "", false).await;
    assert_eq!(health.status, 200);
    proxy.shutdown().await;
}

/// A partial request head of `size` bytes on the proxy listener, held open: how long until the
/// proxy closed it (read 0 or a reset), or `None` when it was still open after `limit`.
async fn partial_proxy_head(proxy: SocketAddr, size: usize, limit: Duration) -> Option<Duration> {
    let mut tcp = TcpStream::connect(proxy).await.ok()?;
    let mut head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-pad: ".to_vec();
    head.resize(size.max(head.len()), b'a');
    let began = Instant::now();
    let _ = tcp.write_all(&head).await;
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout_at((began + limit).into(), tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(began.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// 1,000 partial request heads (60 KiB each) on the proxy listener, on each server: every one
/// is closed at `timeouts.client_head` (1 s here), not at `client_idle` (300 s), the proxy
/// answers meanwhile, and every descriptor comes back. Before `client_head`, a partial head
/// lived `client_idle`: all 1,000 were still open after 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_proxy_heads_are_closed_at_client_head_on_both_servers() {
    let _alone = ALONE.lock().await;
    const HEADS: usize = 1000;
    let client_head = Duration::from_secs(1);
    let upstream = Upstream::openai_chat().tokens(3).start().await;
    for kind in [ServerKind::Native, ServerKind::Hyper] {
        let proxy = proxy_with(upstream.addr, |config| {
            config.server.http1_server = kind;
            config.timeouts.client_idle = Duration::from_secs(300);
            config.timeouts.client_head = client_head;
            config.limits.max_connections = 4096;
        })
        .await;
        let before = descriptors();
        let limit = Duration::from_secs(15);
        let addr = proxy.proxy_addr;
        let heads: Vec<_> = (0..HEADS)
            .map(|_| tokio::spawn(partial_proxy_head(addr, 60 * 1024, limit)))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(stream_chat(addr).await.status, 200, "{kind:?}");
        let (mut open, mut slowest) = (0, Duration::ZERO);
        for head in heads {
            match head.await.unwrap() {
                Some(took) => slowest = slowest.max(took),
                None => open += 1,
            }
        }
        println!("{kind:?}: {HEADS} partial heads of 60 KiB: {open} still open after {limit:?}, the last closed after {slowest:?}");
        assert_eq!(open, 0, "{kind:?}: heads still open after {limit:?}");
        assert!(
            slowest < client_head + Duration::from_secs(8),
            "{kind:?}: {slowest:?}"
        );
        let fell = descriptors_fall_to(before + 16, Duration::from_secs(10)).await;
        assert!(
            fell.is_ok(),
            "{kind:?}: descriptors {before} before, {fell:?} after"
        );
        assert_eq!(stream_chat(addr).await.status, 200, "{kind:?}");
        proxy.shutdown().await;
    }
}
