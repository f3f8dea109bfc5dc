//! The admin listener's lifecycle answers: `/healthz` never depends on the upstream, `/readyz`
//! follows the upstream check and draining, and a drain lets a stream in flight finish while new
//! connections are refused.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::*;

/// A port where nothing listens, held so no other test's listener can take it: the socket is
/// bound but not listening, so a connection to it is refused for as long as it lives, and
/// `listen` on it brings the upstream up on the same port without a race.
fn closed_port() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let got = request(addr, "GET", path, "", false).await;
    (got.status, String::from_utf8(got.bytes()).unwrap())
}

/// Asks `/readyz` until it answers `status`, or panics after 5 s with the last answer.
async fn readyz_until(admin: SocketAddr, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (got, body) = get(admin, "/readyz").await;
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status}; last {got} {body}"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

fn fast_checks(config: &mut metronome::config::Config) {
    config.readiness.interval = ms(100);
    config.readiness.timeout = ms(100);
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_makes_readyz_503_with_the_reason_but_healthz_stays_200() {
    let (down, _held) = closed_port();
    let proxy = proxy_to(down).await;

    let (status, body) = get(proxy.admin_addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: cannot connect to upstream http://127.0.0.1:"),
        "{body}"
    );
    assert_eq!(
        get(proxy.admin_addr, "/healthz").await,
        (200, "ok\n".into())
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_answers_makes_readyz_200() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_to(upstream.addr).await;
    assert_eq!(
        get(proxy.admin_addr, "/readyz").await,
        (200, "ready\n".into())
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn readyz_follows_the_upstream_down_and_back_up() {
    let (addr, held) = closed_port();
    let proxy = proxy_with(addr, fast_checks).await;
    readyz_until(proxy.admin_addr, 503).await;

    // The upstream comes up on the same port.
    let listener = held.listen(64).unwrap();
    readyz_until(proxy.admin_addr, 200).await;

    drop(listener);
    let body = readyz_until(proxy.admin_addr, 503).await;
    assert!(body.contains("cannot connect"), "{body}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_health_path_must_answer_2xx() {
    let sick = Upstream::json("{\"status\":\"loading\"}")
        .status(503)
        .start()
        .await;
    let proxy = proxy_with(sick.addr, |c| {
        c.readiness.path = Some("/health".parse().unwrap());
    })
    .await;
    let (status, body) = get(proxy.admin_addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("GET /health on upstream"), "{body}");
    assert!(body.contains("answered 503"), "{body}");
    let headers = sick.seen.lock().unwrap().headers.last().cloned().unwrap();
    assert_eq!(headers["user-agent"], "metronome-readiness");
    proxy.shutdown().await;

    let healthy = Upstream::json("{}").start().await;
    let proxy = proxy_with(healthy.addr, |c| {
        c.readiness.path = Some("/health".parse().unwrap());
    })
    .await;
    assert_eq!(get(proxy.admin_addr, "/readyz").await.0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn with_the_upstream_check_off_only_draining_counts() {
    let (down, _held) = closed_port();
    let proxy = proxy_with(down, |c| c.readiness.check_upstream = false).await;
    assert_eq!(get(proxy.admin_addr, "/readyz").await.0, 200);
    proxy.state.draining.store(true, Ordering::SeqCst);
    assert_eq!(
        get(proxy.admin_addr, "/readyz").await,
        (503, "not ready: draining\n".into())
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn draining_makes_readyz_503_even_with_the_upstream_up() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_to(upstream.addr).await;
    assert_eq!(get(proxy.admin_addr, "/readyz").await.0, 200);
    proxy.state.draining.store(true, Ordering::SeqCst);
    assert_eq!(
        get(proxy.admin_addr, "/readyz").await,
        (503, "not ready: draining\n".into())
    );
    assert_eq!(get(proxy.admin_addr, "/healthz").await.0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_drain_lets_the_stream_in_flight_finish_and_refuses_new_connections() {
    let upstream = Upstream::openai_chat().tokens(30).every(ms(30));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;
    let proxy_addr = proxy.proxy_addr;

    let in_flight = tokio::spawn(async move { stream_chat(proxy_addr).await });
    // Wait until the stream is under way, then drain.
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.stats.requests.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(ms(10)).await;
    }
    tokio::time::sleep(ms(100)).await;
    let state = proxy.state.clone();
    let admin_addr = proxy.admin_addr;
    let drained = tokio::spawn(proxy.shutdown());
    tokio::time::sleep(ms(100)).await;

    assert!(state.draining.load(Ordering::SeqCst));
    // The admin listener stays up through the drain: readiness says so, metrics still scrape.
    let ready = request(admin_addr, "GET", "/readyz", "", false).await;
    assert_eq!(ready.status, 503);
    assert_eq!(
        request(admin_addr, "GET", "/metrics", "", false)
            .await
            .status,
        200
    );
    let refused = tokio::net::TcpStream::connect(proxy_addr).await;
    assert!(
        refused.is_err(),
        "a new connection during the drain must be refused"
    );

    let got = in_flight.await.unwrap();
    assert_eq!(got.status, 200);
    assert!(got.error.is_none(), "{:?}", got.error);
    assert_eq!(got.bytes(), expected, "the stream in flight ran to its end");
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .expect("the drain ends once the stream is done")
        .unwrap();
    assert_eq!(upstream.stats.completed.load(Ordering::SeqCst), 1);
}

/// Sends `bytes` on a new admin connection and reads until the listener closes it (at most
/// `limit`): the answer, and how long the connection lived.
async fn exchange(admin: SocketAddr, bytes: &[u8], limit: Duration) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(admin).await.unwrap();
    let began = Instant::now();
    tcp.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(limit, tcp.read_to_end(&mut answer)).await;
    (
        String::from_utf8_lossy(&answer).into_owned(),
        began.elapsed(),
    )
}

/// The admin listener's own bounds: a kept-alive connection is closed after `idle_timeout`, a
/// head over `max_header_bytes` gets 431, a head the proxy would refuse gets 400, and a
/// connection beyond `max_connections` gets 503.
#[tokio::test]
async fn the_admin_listener_keeps_its_own_bounds() {
    let (down, _held) = closed_port();
    let proxy = proxy_with(down, |config| {
        config.admin.idle_timeout = ms(500);
        config.admin.head_timeout = Duration::from_secs(5);
        config.admin.max_header_bytes = 8192;
        config.admin.max_connections = 2;
    })
    .await;
    let admin = proxy.admin_addr;
    let limit = Duration::from_secs(10);

    let (answer, lived) = exchange(admin, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", limit).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
    assert!(
        lived >= ms(500) && lived < Duration::from_secs(4),
        "idle for {lived:?}"
    );

    let big = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: {}\r\n\r\n",
        "a".repeat(9000)
    );
    let (answer, _) = exchange(admin, big.as_bytes(), limit).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    for refused in [
        &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
        b"GET /healthz HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"GET /streams/../metrics HTTP/1.1\r\nhost: x\r\n\r\n",
    ] {
        let (answer, lived) = exchange(admin, refused, limit).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(
            lived < Duration::from_secs(4),
            "closed at once, not after {lived:?}"
        );
    }

    // Two connections held idle fill the listener; a third is told so and closed.
    let held: Vec<_> =
        futures_util::future::join_all((0..2).map(|_| tokio::net::TcpStream::connect(admin))).await;
    let (answer, _) = exchange(admin, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", limit).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop(held);
    proxy.shutdown().await;
}
