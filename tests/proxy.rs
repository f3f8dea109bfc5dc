//! The metering proxy against scripted upstreams on loopback: what the client gets, and what the
//! metrics say. Counts are asserted exactly; durations with generous margins.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;

const ITL: &str = "metronome_inter_token_latency_seconds_count";

#[tokio::test]
async fn a_stream_with_one_stall_is_metered_at_ingress_and_egress() {
    let upstream = Upstream::openai_chat()
        .tokens(40)
        .every(ms(30))
        .stall_before(20, ms(300));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;

    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none());
    assert_eq!(
        got.bytes(),
        expected,
        "the client gets exactly the upstream's bytes"
    );
    assert!(got.headers.contains_key("x-metronome-stream-id"));

    let m = scrape_after_stream(&proxy).await;
    let chat = [("route", "chat"), ("model", "test-model")];
    for point in ["ingress", "egress"] {
        let at = [chat[0], chat[1], ("point", point)];
        assert_eq!(
            m.value(ITL, &at),
            39.0,
            "{point}: 39 gaps between 40 token events"
        );
        assert_eq!(
            m.value("metronome_stalls_total", &at),
            1.0,
            "{point}: one stall"
        );
        assert_eq!(m.value("metronome_stall_duration_seconds_count", &at), 1.0);
        assert_eq!(
            m.value("metronome_time_to_first_token_seconds_count", &at),
            1.0
        );
        assert_eq!(m.value("metronome_stream_jank_ratio_count", &at), 1.0);
        // The stall is over 200 ms; every other gap is far below it.
        let over_200ms = m.value(ITL, &at)
            - m.value(
                "metronome_inter_token_latency_seconds_bucket",
                &[chat[0], chat[1], ("point", point), ("le", "0.2")],
            );
        assert_eq!(over_200ms, 1.0, "{point}");
        assert_eq!(
            m.value(
                "metronome_time_to_first_byte_seconds_count",
                &[("route", "chat"), ("point", point)]
            ),
            1.0
        );
    }
    let complete = [chat[0], chat[1], ("outcome", "complete")];
    assert_eq!(m.value("metronome_streams_total", &complete), 1.0);
    assert_eq!(
        m.value(
            "metronome_output_tokens_total",
            &[chat[0], chat[1], ("source", "usage")]
        ),
        40.0
    );
    assert_eq!(
        m.value("metronome_time_per_output_token_seconds_count", &chat),
        1.0
    );
    assert_eq!(m.value("metronome_tokens_per_event_count", &chat), 40.0);
    assert_eq!(m.value("metronome_tokens_per_event_sum", &chat), 40.0);
    // 44 frames: role, 40 tokens, finish, usage, [DONE]; each is one event.
    assert_eq!(
        m.value(
            "metronome_events_per_frame_sum",
            &[("route", "chat"), ("point", "ingress")]
        ),
        44.0
    );
    assert_eq!(
        m.value("metronome_proxy_delay_seconds_count", &[("route", "chat")]),
        44.0
    );
    assert_eq!(
        m.value(
            "metronome_requests_total",
            &[("route", "chat"), ("status_class", "2xx")]
        ),
        1.0
    );
    assert_eq!(
        m.value("metronome_streams_active", &[("route", "chat")]),
        0.0
    );
    assert_eq!(m.value("metronome_build_info", &[]), 1.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_usage_tokens_are_counted() {
    let upstream = Upstream::openai_chat()
        .tokens(12)
        .every(ms(5))
        .usage(false)
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    stream_chat(proxy.proxy_addr).await;
    let m = scrape_after_stream(&proxy).await;
    assert_eq!(
        m.value("metronome_output_tokens_total", &[("source", "counted")]),
        12.0
    );
    assert_eq!(
        m.get("metronome_output_tokens_total", &[("source", "usage")]),
        None
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_slow_client_shows_as_proxy_delay_while_ingress_keeps_the_upstream_cadence() {
    // 200 frames of 64 KiB every 10 ms: far more than the socket buffers hold while the client
    // does not read. The proxy's buffer is set large so ingress never feels backpressure.
    let frame = {
        let mut event = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
        event.extend(std::iter::repeat_n(b'x', 64 * 1024));
        event.extend_from_slice(b"\"}}]}\n\n");
        Bytes::from(event)
    };
    let upstream = Upstream::sse_frames(&vec![frame; 200], ms(10))
        .start()
        .await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.metering.buffer_bytes = 64 * 1024 * 1024;
        c.metering.buffer_frames = 4096;
        c.metering.max_event_bytes = 128 * 1024;
    })
    .await;

    // A client with a small receive buffer that reads the head, pauses 2.5 s, then reads it all.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket.connect(proxy.proxy_addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = stream.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    tokio::time::sleep(ms(2500)).await;
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let n = stream.read(&mut buf).await.unwrap();
        // The read that ends the body can carry data before the last chunk (on a loaded machine
        // more is waiting by then): count it too.
        total += n;
        if n == 0 || buf[..n].ends_with(b"0\r\n\r\n") {
            break;
        }
    }
    assert!(total > 200 * 64 * 1024, "got {total} bytes");

    let m = scrape_after_stream(&proxy).await;
    let delays = m.value("metronome_proxy_delay_seconds_count", &[("route", "chat")]);
    let quick = m.value(
        "metronome_proxy_delay_seconds_bucket",
        &[("route", "chat"), ("le", "0.1")],
    );
    // hyper may read one 64 KiB upstream write as more than one frame: at least 200.
    assert!(delays >= 200.0, "{delays}");
    assert!(
        delays - quick >= 50.0,
        "frames stuck behind the slow client show delays over 100 ms ({quick} of {delays} were quick)"
    );
    let ingress = [("route", "chat"), ("point", "ingress")];
    let egress = [("route", "chat"), ("point", "egress")];
    assert_eq!(
        m.value("metronome_stalls_total", &ingress),
        0.0,
        "ingress keeps the cadence"
    );
    assert!(
        m.value("metronome_stalls_total", &egress) >= 1.0,
        "egress shows the pause"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_upstream() {
    let upstream = Upstream::openai_chat()
        .tokens(200)
        .every(ms(50))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;

    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .body(http_body_util::Full::new(Bytes::from("{}")))
        .unwrap();
    let response = client.request(req).await.unwrap();
    let mut body = response.into_body();
    use http_body_util::BodyExt;
    for _ in 0..5 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    drop(client);

    upstream
        .wait_for_a_cancel("the upstream never saw the cancel")
        .await;
    let m = one_chat_stream_ended_as(&proxy, "client_cancelled").await;
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
    assert_eq!(upstream.stats.completed.load(Ordering::SeqCst), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_client_that_disconnects_before_the_first_byte_cancels_the_upstream() {
    let upstream = Upstream::openai_chat()
        .head_delay(ms(100))
        .tokens(3)
        .then(Step::Hang)
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let addr = proxy.proxy_addr;
    let client = tokio::spawn(async move { stream_chat(addr).await });
    tokio::time::sleep(ms(400)).await;
    client.abort();
    upstream
        .wait_for_a_cancel("the upstream never saw the cancel")
        .await;
    let m = scrape_after_stream(&proxy).await;
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_gets_a_502_with_a_json_body() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let proxy = proxy_to(closed).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.headers["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&got.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "upstream_unavailable");
    // What kind of failure, not the address or the OS error (tests/hostile_upstreams.rs).
    assert_eq!(
        body["error"]["message"], "the upstream could not be reached",
        "{body}"
    );
    let m = scrape(&proxy).await;
    assert_eq!(
        m.value(
            "metronome_upstream_errors_total",
            &[("route", "chat"), ("kind", "connect")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "metronome_requests_total",
            &[("route", "chat"), ("status_class", "5xx")]
        ),
        1.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_slow_upstream_head_gets_a_504() {
    let upstream = Upstream::openai_chat().head_delay(ms(3000)).start().await;
    let proxy = proxy_with(upstream.addr, |c| c.timeouts.first_byte = ms(300)).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 504);
    let body: serde_json::Value = serde_json::from_slice(&got.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "upstream_timeout");
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_reset_mid_stream_aborts_the_client_response() {
    let upstream = Upstream::openai_chat()
        .tokens(5)
        .every(ms(5))
        .usage(false)
        .then(Step::Reset(ms(20)));
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert!(
        got.error.is_some(),
        "the response must be aborted, not ended as complete"
    );
    let m = one_chat_stream_ended_as(&proxy, "upstream_error").await;
    assert_eq!(
        m.value("metronome_upstream_errors_total", &[("route", "chat")]),
        1.0
    );
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_goes_silent_times_out() {
    let upstream = Upstream::openai_chat()
        .tokens(3)
        .then(Step::Hang)
        .start()
        .await;
    let proxy = proxy_with(upstream.addr, |c| c.timeouts.idle = ms(300)).await;
    // A timer that never fires would leave the client waiting for ever: bound the wait, so that
    // fails the test rather than hanging it.
    let got = tokio::time::timeout(Duration::from_secs(30), stream_chat(proxy.proxy_addr))
        .await
        .expect("the idle timeout aborted the stream");
    assert!(got.error.is_some());
    let m = one_chat_stream_ended_as(&proxy, "upstream_timeout").await;
    assert_eq!(
        m.value("metronome_streams_total", &[("finish_reason", "error")]),
        1.0,
        "a silent upstream is an error, whatever the body said before"
    );
    assert_eq!(
        m.value("metronome_upstream_errors_total", &[("kind", "timeout")]),
        1.0
    );
    upstream
        .wait_for_a_cancel("the silent upstream was never let go")
        .await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_error_event_mid_stream_is_an_upstream_error() {
    let upstream = Upstream::openai_chat()
        .tokens(3)
        .usage(false)
        .then(Step::Frame(
            ms(1),
            Bytes::from("data: {\"error\":{\"message\":\"overloaded\",\"code\":503}}\n\n"),
        ))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert!(got.error.is_none(), "the bytes are forwarded as they are");
    one_chat_stream_ended_as(&proxy, "upstream_error").await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_stream_without_tokens_is_no_token() {
    let upstream = Upstream::openai_chat().tokens(0).start().await;
    let proxy = proxy_to(upstream.addr).await;
    stream_chat(proxy.proxy_addr).await;
    one_chat_stream_ended_as(&proxy, "no_token").await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn non_streams_pass_through_with_request_metrics_only() {
    let upstream = Upstream::json(r#"{"object":"list","data":[]}"#)
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let got = request(proxy.proxy_addr, "GET", "/v1/models", "", false).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.bytes(), br#"{"object":"list","data":[]}"#);
    assert!(!got.headers.contains_key("x-metronome-stream-id"));
    let m = scrape_until(&proxy, |m| {
        m.get("metronome_request_duration_seconds_count", &[])
            .is_some()
    })
    .await;
    assert_eq!(
        m.value(
            "metronome_requests_total",
            &[("route", "other"), ("status_class", "2xx")]
        ),
        1.0
    );
    assert_eq!(m.get("metronome_streams_total", &[]), None);
    proxy.shutdown().await;
}

#[tokio::test]
async fn http2_clients_are_served_and_metered() {
    let upstream = Upstream::openai_chat().tokens(10).every(ms(5));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;
    let got = request(proxy.proxy_addr, "POST", "/v1/chat/completions", "{}", true).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.bytes(), expected);
    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    assert_eq!(m.value(ITL, &[("point", "egress")]), 9.0);
    assert_eq!(m.value(ITL, &[("point", "ingress")]), 9.0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn hop_by_hop_headers_are_dropped_and_forwarding_headers_appended() {
    let upstream = Upstream::openai_chat().echo_headers().start().await;
    let proxy = proxy_to(upstream.addr).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    stream
        .write_all(
            b"GET /echo HTTP/1.1\r\nhost: metronome.test\r\nconnection: close, x-hop\r\nx-hop: 1\r\nkeep-alive: timeout=5\r\nte: trailers\r\nx-forwarded-for: 10.1.2.3\r\nauthorization: Bearer k\r\n\r\n",
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let body = &text[text.find('{').unwrap()..text.rfind('}').unwrap() + 1];
    let seen: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(seen["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["authorization"], "Bearer k");
    assert_eq!(seen["host"], "metronome.test");
    for gone in ["x-hop", "keep-alive", "te", "connection"] {
        assert!(
            seen.get(gone).is_none(),
            "{gone} must not reach the upstream: {seen}"
        );
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_admin_listener_answers_health_readiness_and_metrics() {
    let upstream = Upstream::openai_chat().start().await;
    let proxy = proxy_to(upstream.addr).await;
    let metrics = request(proxy.admin_addr, "GET", "/metrics", "", false).await;
    assert_eq!(
        metrics.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(
        request(proxy.admin_addr, "GET", "/healthz", "", false)
            .await
            .status,
        200
    );
    assert_eq!(
        request(proxy.admin_addr, "GET", "/readyz", "", false)
            .await
            .status,
        200
    );
    assert_eq!(
        request(proxy.admin_addr, "GET", "/nope", "", false)
            .await
            .status,
        404
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_stream_with_a_content_length_is_complete_once_every_byte_is_out() {
    // hyper never asks a body with a known length for its end: delivery is judged by the bytes.
    let upstream = Upstream::openai_chat()
        .tokens(6)
        .every(ms(5))
        .with_content_length();
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_to(upstream.addr).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(
        got.headers["content-length"],
        expected.len().to_string().as_str()
    );
    assert_eq!(got.bytes(), expected);
    one_chat_stream_ended_as(&proxy, "complete").await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn with_metering_off_streams_pass_through_unmeasured() {
    let upstream = Upstream::openai_chat().tokens(5).every(ms(2));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_with(upstream.addr, |c| c.metering.enabled = false).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.bytes(), expected);
    assert!(!got.headers.contains_key("x-metronome-stream-id"));
    let m = scrape_until(&proxy, |m| {
        m.get("metronome_request_duration_seconds_count", &[])
            .is_some()
    })
    .await;
    assert_eq!(m.get("metronome_streams_total", &[]), None);
    assert_eq!(
        m.value("metronome_requests_total", &[("route", "chat")]),
        1.0
    );
    proxy.shutdown().await;
}

/// One request on a fresh keep-alive connection to the proxy; returns the connection's sender and
/// the task that drives it (it ends when the proxy closes the connection).
async fn keep_alive_connection(
    proxy: &metronome::proxy::ProxyHandle,
) -> (
    hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(proxy.proxy_addr)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let response = sender.send_request(json_request()).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    (sender, conn)
}

fn json_request() -> http::Request<http_body_util::Full<Bytes>> {
    http::Request::get("/v1/models")
        .header("host", "metronome.test")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn an_idle_client_connection_is_closed_after_client_idle_and_kept_before() {
    let upstream = Upstream::json("{\"data\":[]}").start().await;

    // timeouts.client_idle = 1s: a connection idle for longer is closed by the proxy.
    let proxy = proxy_with(upstream.addr, |c| {
        c.timeouts.client_idle = Duration::from_secs(1)
    })
    .await;
    let (_sender, conn) = keep_alive_connection(&proxy).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        closed.is_ok(),
        "the proxy keeps a connection idle for 10 s open with client_idle = 1s"
    );
    proxy.shutdown().await;

    // The default (300 s): a connection idle for 2 s still takes the next request.
    let proxy = proxy_with(upstream.addr, |_| {}).await;
    let (mut sender, conn) = keep_alive_connection(&proxy).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !conn.is_finished(),
        "the proxy closed an idle connection after 2 s"
    );
    let response = sender.send_request(json_request()).await.unwrap();
    assert_eq!(response.status(), 200);
    proxy.shutdown().await;
}

/// A collector whose every gather takes 30 ms, so scrapes straddle the recording of streams.
struct SlowCollector(prometheus::core::Desc);

impl prometheus::core::Collector for SlowCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.0]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        std::thread::sleep(ms(30));
        Vec::new()
    }
}

/// The CI flake of the fifth session: a scrape walks its collectors in no fixed order, so one
/// taken while a stream was recorded held some of its figures and not others, and a test that
/// waited for the stream's count read the rest as missing. Here gathers take 30 ms and the test
/// scrapes while each stream runs, so streams end during scrapes; what `scrape_until` returns must
/// hold the whole stream. The order of the collectors is drawn anew for each registry, so the
/// test runs several proxies. (With `scrape_until` returning the scrape that first saw the count,
/// this failed 5 runs in 6.)
#[tokio::test]
async fn a_stream_seen_by_a_slow_scrape_is_seen_whole() {
    const PROXIES: usize = 12;
    const STREAMS: u32 = 3;
    let upstream = Upstream::openai_chat()
        .tokens(6)
        .every(ms(15))
        .start()
        .await;
    for p in 0..PROXIES {
        let proxy = proxy_to(upstream.addr).await;
        let desc = prometheus::core::Desc::new(
            "test_slow_collector".into(),
            "slows every scrape".into(),
            Vec::new(),
            Default::default(),
        )
        .unwrap();
        proxy
            .state
            .metrics
            .register(Box::new(SlowCollector(desc)))
            .unwrap();

        for n in 1..=STREAMS {
            let what = format!("proxy {p} stream {n}");
            let client = tokio::spawn(stream_chat(proxy.proxy_addr));
            let m = scrape_until(&proxy, |m| {
                m.value("metronome_streams_total", &[]) == f64::from(n)
            })
            .await;
            assert_eq!(client.await.unwrap().status, 200);
            let chat = [("route", "chat")];
            for point in ["ingress", "egress"] {
                let at = [("route", "chat"), ("point", point)];
                assert_eq!(m.value(ITL, &at), f64::from(5 * n), "{what} {point}");
                assert_eq!(
                    m.value("metronome_time_to_first_token_seconds_count", &at),
                    f64::from(n),
                    "{what} {point}"
                );
            }
            assert_eq!(
                m.value("metronome_proxy_delay_seconds_count", &chat),
                f64::from(10 * n),
                "{what}"
            );
            assert_eq!(
                m.value("metronome_stream_format_total", &chat),
                f64::from(n),
                "{what}"
            );
        }
        proxy.shutdown().await;
    }
}
