//! The batch counters' exemplars (docs/metrics.md, "Exemplars") end to end:
//! `metronome sim --engine batch` behind the proxy, six streams decoding, one of them with a
//! stall of its own, and one long prompt whose prefill holds the batch. (Six, not four: after one
//! stream's own 300 ms stall in its first half second, four streams inside a hitch at once is
//! about 1e-5 by chance under the episode rule, not rare enough for `batch.false_positive`.)
//! The OpenMetrics scrape (parsed by prometheus_client) and the protobuf scrape carry an exemplar
//! on `metronome_hitches_total{scope="stream"}` naming the stalled stream, and one on
//! `metronome_batch_episodes_total` naming a stream the episode caught; both resolve at the
//! admin `/streams/{id}`, and the episode's at `/episodes` too. Every request has a
//! `traceparent` of its own, and each exemplar carries its stream's trace ID.
//!
//! The stall (300 ms, about 200 ms in) and the hold (300 ms, from 700 ms) are far apart, and a
//! stall is the longest gap of its scope by far, so the named streams are exact.

use crate::support;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use metronome::metrics::proto::MetricFamily;
use metronome::sim::SimConfig;
use prost::Message;
use serde_json::Value;
use support::*;

/// Each request's own trace: request `i` (the long prompt is `STREAMS`) gets trace ID `i + 1`.
fn trace_id(i: usize) -> String {
    format!("{:032x}", i + 1)
}
const STREAMS: usize = 6;
/// The loop's step, and the long prompt's hold: 3,000 prompt tokens × 100 µs.
const GAP: u64 = 20;
const LONG_PROMPT_TOKENS: u64 = 3_000;
const LONG_AT: u64 = 700;
/// The stalled stream's stall, before its 10th token event (about 200 ms in).
const STALL: u64 = 300;
const STALL_AT: u64 = 10;
/// Enough tokens to decode past the hold.
const TOKENS: u64 = 70;

fn chat_body(max_tokens: u64, prompt_tokens: u64, stall_at: Option<u64>) -> String {
    let stall = stall_at.map_or(String::new(), |n| format!(r#","sim_stall_at":{n}"#));
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{max_tokens},"sim_prompt_tokens":{prompt_tokens}{stall},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// A request through the proxy with these headers, read to its end; its status and stream ID.
async fn send(
    addr: std::net::SocketAddr,
    path: &str,
    body: String,
    headers: &[(&str, &str)],
) -> (u16, String, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let method = if body.is_empty() { "GET" } else { "POST" };
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let id = response
        .headers()
        .get("x-metronome-stream-id")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, id, bytes)
}

/// The exemplar's `stream_id` on the `_total` sample of `family` whose labels include `labels`.
fn om_exemplar(parsed: &Value, family: &str, labels: &[(&str, &str)]) -> Value {
    let family = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == family)
        .unwrap_or_else(|| panic!("no family {family}"));
    assert_eq!(family["type"], "counter");
    let sample = family["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| labels.iter().all(|(n, v)| s["labels"][*n] == *v))
        .unwrap_or_else(|| panic!("no sample {labels:?} in {family}"));
    sample["exemplar"].clone()
}

/// The protobuf counter exemplar's `stream_id` of the series of `family` with `label`.
fn proto_stream_id(families: &[MetricFamily], family: &str, label: (&str, &str)) -> String {
    let family = families.iter().find(|f| f.name == family).unwrap();
    let metric = family
        .metric
        .iter()
        .find(|m| {
            m.label
                .iter()
                .any(|l| l.name == label.0 && l.value == label.1)
        })
        .unwrap();
    let exemplar = metric
        .counter
        .as_ref()
        .and_then(|c| c.exemplar.as_ref())
        .unwrap_or_else(|| panic!("no exemplar on {label:?}"));
    assert_eq!(exemplar.value, 1.0, "the increment");
    exemplar
        .label
        .iter()
        .find(|l| l.name == "stream_id")
        .unwrap()
        .value
        .clone()
}

async fn detail(admin: std::net::SocketAddr, id: &str) -> Value {
    let (status, _, body) = send(admin, &format!("/streams/{id}"), String::new(), &[]).await;
    assert_eq!(status, 200, "/streams/{id} resolves");
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hitch_and_episode_exemplars_name_streams_that_resolve() {
    let sim = sim_with(SimConfig {
        stall: ms(STALL),
        ..batch_engine(ms(GAP))
    })
    .await;
    let proxy = proxy_to(sim.addr()).await;
    let addr = proxy.proxy_addr;

    let traceparent = |i: usize| format!("00-{}-00f067aa0ba902b7-01", trace_id(i));
    let decoding = futures_util::future::join_all((0..STREAMS).map(|i| async move {
        tokio::time::sleep(ms(5 * i as u64)).await;
        let stall = (i == 0).then_some(STALL_AT);
        let headers = [("traceparent", traceparent(i))];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        send(
            addr,
            "/v1/chat/completions",
            chat_body(TOKENS, 1, stall),
            &headers,
        )
        .await
    }));
    let long = async {
        tokio::time::sleep(ms(LONG_AT)).await;
        let body = chat_body(2, LONG_PROMPT_TOKENS, None);
        let header = traceparent(STREAMS);
        send(
            addr,
            "/v1/chat/completions",
            body,
            &[("traceparent", &header)],
        )
        .await
    };
    let (decoding, long) = tokio::join!(decoding, long);
    assert!(decoding
        .iter()
        .chain([&long])
        .all(|(status, ..)| *status == 200));
    let stalled = decoding[0].1.clone();
    // Every request's stream ID, by its index (the long prompt last).
    let requests: Vec<String> = decoding
        .iter()
        .chain([&long])
        .map(|(_, id, _)| id.clone())
        .collect();

    scrape_until(&proxy, |m| {
        m.value("metronome_streams_total", &[]) == (STREAMS + 1) as f64
            && m.value("metronome_batch_episodes_total", &[]) >= 1.0
            && m.value("metronome_hitches_total", &[("scope", "stream")]) >= 1.0
            && m.value("metronome_hitches_total", &[("scope", "batch")]) >= 1.0
    })
    .await;

    // OpenMetrics, as prometheus_client parses it.
    let openmetrics = [(
        "accept",
        "application/openmetrics-text;version=1.0.0;q=0.75,text/plain;version=0.0.4;q=0.5",
    )];
    let (_, _, body) = send(proxy.admin_addr, "/metrics", String::new(), &openmetrics).await;
    let parsed = parse_openmetrics(&body);
    // What docs/batch.md shows.
    for line in String::from_utf8_lossy(&body).lines().filter(|l| {
        l.starts_with("metronome_hitches_total") || l.starts_with("metronome_batch_episodes_total")
    }) {
        eprintln!("{line}");
    }

    // The stream-scope hitch names the stalled stream, with its trace.
    let hitch = om_exemplar(&parsed, "metronome_hitches", &[("scope", "stream")]);
    assert_eq!(hitch["labels"]["stream_id"], stalled.as_str(), "{hitch}");
    assert_eq!(hitch["labels"]["trace_id"], trace_id(0).as_str());
    assert_eq!(hitch["value"], 1.0, "the increment");
    let marks = detail(proxy.admin_addr, &stalled).await["hitches"].clone();
    assert!(
        marks
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["scope"] == "stream"),
        "{marks}"
    );

    // A batch-scope hitch names a decoding stream, which resolves too.
    let batch = om_exemplar(&parsed, "metronome_hitches", &[("scope", "batch")]);
    let batch_id = batch["labels"]["stream_id"].as_str().unwrap().to_owned();
    let named = requests
        .iter()
        .position(|id| *id == batch_id)
        .unwrap_or_else(|| panic!("{batch} names no request"));
    assert_eq!(batch["labels"]["trace_id"], trace_id(named).as_str());
    detail(proxy.admin_addr, &batch_id).await;

    // The episode names a stream it caught: listed at /episodes and resolving at /streams/{id}.
    let episode = om_exemplar(
        &parsed,
        "metronome_batch_episodes",
        &[("upstream", "default")],
    );
    let caught = episode["labels"]["stream_id"].as_str().unwrap().to_owned();
    assert_eq!(episode["value"], 1.0);
    let named = requests
        .iter()
        .position(|id| *id == caught)
        .unwrap_or_else(|| panic!("{episode} names no request"));
    assert_eq!(episode["labels"]["trace_id"], trace_id(named).as_str());
    let (_, _, episodes) = send(proxy.admin_addr, "/episodes", String::new(), &[]).await;
    let episodes: Value = serde_json::from_slice(&episodes).unwrap();
    assert!(
        episodes["episodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["stream_ids"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| *s == *caught)),
        "{caught} in {episodes}"
    );
    let marked = detail(proxy.admin_addr, &caught).await["hitches"].clone();
    assert!(
        marked
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["scope"] == "batch"),
        "{marked}"
    );

    // The episode histograms' exemplars (each episode's last arrival: the long prompt, unless a
    // loaded machine paused the sim's loop) carry their stream's own trace too.
    let duration = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "metronome_batch_episode_duration_seconds")
        .unwrap();
    let arrivals: Vec<&Value> = duration["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["exemplar"])
        .filter(|e| !e.is_null())
        .collect();
    assert!(!arrivals.is_empty(), "{duration}");
    for e in arrivals {
        let index = requests
            .iter()
            .position(|id| *id == e["labels"]["stream_id"])
            .unwrap_or_else(|| panic!("{e} names no request"));
        assert_eq!(e["labels"]["trace_id"], trace_id(index).as_str());
    }

    // Protobuf carries the same exemplars (a scrape that shows them keeps them until the next
    // hitch of the series replaces them).
    let protobuf = [(
        "accept",
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
    )];
    let (_, _, mut body) = send(proxy.admin_addr, "/metrics", String::new(), &protobuf).await;
    let mut families = Vec::new();
    while body.has_remaining() {
        families.push(MetricFamily::decode_length_delimited(&mut body).unwrap());
    }
    assert_eq!(
        proto_stream_id(&families, "metronome_hitches_total", ("scope", "stream")),
        stalled
    );
    assert_eq!(
        proto_stream_id(
            &families,
            "metronome_batch_episodes_total",
            ("upstream", "default")
        ),
        caught
    );

    // The text format has no exemplar.
    let text = scrape(&proxy).await;
    assert!(
        text.0
            .lines()
            .filter(|l| l.starts_with("metronome_hitches_total")
                || l.starts_with("metronome_batch_episodes_total"))
            .all(|l| !l.contains('#')),
        "{}",
        text.0
    );
    sim.shutdown().await.unwrap();
}
