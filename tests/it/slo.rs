//! Live goodput: requests carrying llm-d's latency objectives (`x-llm-d-slo-ttft-ms`,
//! `x-llm-d-slo-tpot-ms`) are judged when their stream ends, and counted met or missed per
//! objective in `metronome_slo_streams_total`. Counts exact; the cadence leaves wide margins
//! (20 ms between tokens against objectives of 5 ms and 1 s).

use crate::support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioExecutor;
use support::*;

const SLO: &str = "metronome_slo_streams_total";

/// Streams one chat completion through the proxy with `headers`, to its end.
async fn stream_with(addr: std::net::SocketAddr, headers: &[(&str, &str)]) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = Full::new(Bytes::from_static(
        br#"{"model":"test-model","stream":true}"#,
    ));
    let response = client.request(request.body(body).unwrap()).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
}

#[tokio::test]
async fn each_objective_a_request_sets_is_counted_met_or_missed() {
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(20))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let addr = proxy.proxy_addr;
    stream_with(
        addr,
        &[
            ("x-llm-d-slo-ttft-ms", "5000"),
            ("x-llm-d-slo-tpot-ms", "1000"),
        ],
    )
    .await;
    stream_with(
        addr,
        &[
            ("x-llm-d-slo-ttft-ms", "5000"),
            ("x-llm-d-slo-tpot-ms", "5"),
        ],
    )
    .await;
    stream_with(addr, &[]).await;
    stream_with(addr, &[("x-llm-d-slo-ttft-ms", "soon")]).await;

    let m = scrape_until(&proxy, |m| {
        m.get("metronome_streams_total", &[("outcome", "complete")]) == Some(4.0)
    })
    .await;
    let count = |objective: &str, result: &str| {
        m.get(
            SLO,
            &[
                ("route", "chat"),
                ("model", "test-model"),
                ("objective", objective),
                ("result", result),
            ],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(count("ttft", "met"), 2.0, "{}", m.0);
    assert_eq!(count("ttft", "missed"), 0.0);
    assert_eq!(count("tpot", "met"), 1.0);
    assert_eq!(count("tpot", "missed"), 1.0);
    assert_eq!(count("all", "met"), 1.0);
    assert_eq!(count("all", "missed"), 1.0);
    // The requests with no objective, or only a malformed one, are not counted at all.
    let judged: f64 = ["met", "missed"].iter().map(|r| count("all", r)).sum();
    assert_eq!(judged, 2.0);
}
