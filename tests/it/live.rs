//! The live flush (`metrics.flush_interval`, default 1 s): a gap reaches `/metrics` while its
//! stream still runs, and at the stream's end every count is exact. A 200-token stream at 50 ms
//! with a 400 ms stall before token 10: the stall and the gaps before it show within 1.5 s of the
//! stall's end, seconds before the stream ends. Counts exact; durations with wide margins.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioExecutor;
use support::*;

const ITL: &str = "metronome_inter_token_latency_seconds_count";
const STALLS: &str = "metronome_stalls_total";

/// Streams a chat completion and notes when each body frame arrived, as it arrives.
async fn stream_noting(addr: std::net::SocketAddr, arrivals: Arc<Mutex<Vec<Instant>>>) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"test-model","stream":true}"#,
        )))
        .unwrap();
    let mut body = client.request(request).await.unwrap().into_body();
    while let Some(frame) = body.frame().await {
        if frame.unwrap().is_data() {
            arrivals.lock().unwrap().push(Instant::now());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_reaches_metrics_while_its_stream_runs() {
    let upstream = Upstream::openai_chat()
        .tokens(200)
        .every(ms(50))
        .stall_before(10, ms(400))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    assert_eq!(
        proxy.state.config.flush_interval,
        Some(Duration::from_secs(1))
    );
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let client = tokio::spawn(stream_noting(proxy.proxy_addr, arrivals.clone()));

    let ingress = [("route", "chat"), ("point", "ingress")];
    let egress = [("route", "chat"), ("point", "egress")];
    let (seen_at, gaps_then, frames_then) = loop {
        let m = scrape(&proxy).await;
        let stalled = m.get(STALLS, &ingress) == Some(1.0) && m.get(STALLS, &egress) == Some(1.0);
        if stalled {
            let frames = arrivals.lock().unwrap().len();
            break (Instant::now(), m.value(ITL, &ingress), frames);
        }
        assert!(
            !client.is_finished(),
            "the stream ended before its stall showed:\n{}",
            m.0
        );
        tokio::time::sleep(ms(50)).await;
    };
    // When the client got the frame after the stall: the first gap over 300 ms.
    let stall_end = {
        let arrivals = arrivals.lock().unwrap();
        let at = arrivals
            .windows(2)
            .find(|w| w[1] - w[0] > ms(300))
            .map(|w| w[1]);
        at.expect("the client saw the stall")
    };
    let late = seen_at.saturating_duration_since(stall_end);
    assert!(
        late < Duration::from_millis(1500),
        "the stall showed {late:?} after it ended"
    );
    assert!(
        frames_then < 150,
        "the stall showed after {frames_then} of 200 frames, not while the stream ran"
    );
    assert!(
        gaps_then >= 9.0,
        "the gaps up to the stall were flushed too: {gaps_then}"
    );

    client.await.unwrap();
    let m = scrape_until(&proxy, |m| {
        m.get("metronome_streams_total", &[("outcome", "complete")]) == Some(1.0)
    })
    .await;
    for at in [ingress, egress] {
        assert_eq!(m.value(ITL, &at), 199.0, "every gap exactly once");
        assert_eq!(m.value(STALLS, &at), 1.0, "the stall exactly once");
    }
    assert_eq!(
        m.value("metronome_time_to_first_token_seconds_count", &ingress),
        1.0
    );
}

#[tokio::test]
async fn with_flush_interval_0s_a_stream_shows_only_at_its_end() {
    let upstream = Upstream::openai_chat()
        .tokens(40)
        .every(ms(50))
        .start()
        .await;
    let toml = format!(
        "{}\n[metrics]\nflush_interval = \"0s\"\n",
        proxy_toml(upstream.addr)
    );
    let config = metronome::config::Config::from_toml(&toml).unwrap();
    assert_eq!(config.flush_interval, None);
    let proxy = metronome::proxy::ProxyHandle::start(config).await.unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let client = tokio::spawn(stream_noting(proxy.proxy_addr, arrivals.clone()));
    // 1.5 s into a 2 s stream: nothing of it on /metrics yet.
    tokio::time::sleep(ms(1500)).await;
    assert!(!client.is_finished());
    let m = scrape(&proxy).await;
    assert_eq!(m.get(ITL, &[("point", "ingress")]), None, "{}", m.0);
    client.await.unwrap();
    let m = scrape_after_stream(&proxy).await;
    assert_eq!(
        m.value(ITL, &[("route", "chat"), ("point", "ingress")]),
        39.0
    );
}
