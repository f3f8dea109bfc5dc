//! `/metrics` in each format a scraper may ask for, after a real stream with a stall through the
//! proxy: the protobuf scrape decodes back to exactly the counts of the text scrape (classic
//! buckets) and of the gaps (native buckets), the OpenMetrics scrape parses with Python's
//! prometheus_client parser and carries the stall's exemplar, and no Accept header still gets the
//! text format 0.0.4.

use crate::support;

use std::net::SocketAddr;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioExecutor;
use metronome::metrics::proto::MetricFamily;
use metronome::proxy::ProxyHandle;
use prost::Message;
use support::*;

const PROTOBUF: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
const OPENMETRICS: &str =
    "application/openmetrics-text;version=1.0.0;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (String, Bytes) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (content_type, body)
}

/// One chat stream with a `traceparent`, 30 tokens 10 ms apart and a 300 ms stall before the
/// 15th; returns its stream ID once it is recorded.
async fn stream_with_a_stall(proxy: &ProxyHandle) -> String {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{}/v1/chat/completions", proxy.proxy_addr))
        .header("content-type", "application/json")
        .header("traceparent", TRACEPARENT)
        .body(Full::new(Bytes::from(
            r#"{"model":"test-model","stream":true}"#,
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let id = response.headers()["x-metronome-stream-id"]
        .to_str()
        .unwrap()
        .to_string();
    response.into_body().collect().await.unwrap();
    scrape_after_stream(proxy).await;
    id
}

fn decode(mut body: Bytes) -> Vec<MetricFamily> {
    let mut families = Vec::new();
    while body.has_remaining() {
        families.push(MetricFamily::decode_length_delimited(&mut body).unwrap());
    }
    families
}

#[tokio::test]
async fn each_format_carries_exactly_the_counts_and_the_exemplars() {
    let upstream = Upstream::openai_chat()
        .tokens(30)
        .every(ms(10))
        .stall_before(15, ms(300))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let id = stream_with_a_stall(&proxy).await;

    // No Accept header, and a scraper that lists only text: the text format, as before.
    let (content_type, text) = get(proxy.admin_addr, "/metrics", &[]).await;
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let text = support::Metrics(String::from_utf8(text.to_vec()).unwrap());
    let (plain_type, _) = get(proxy.admin_addr, "/metrics", &[("accept", "text/plain")]).await;
    assert_eq!(plain_type, content_type);

    // Protobuf: the same classic counts as the text scrape, and native buckets as many.
    let (content_type, body) = get(proxy.admin_addr, "/metrics", &[("accept", PROTOBUF)]).await;
    assert!(
        content_type.starts_with("application/vnd.google.protobuf"),
        "{content_type}"
    );
    let families = decode(body);
    let itl = families
        .iter()
        .find(|f| f.name == "metronome_inter_token_latency_seconds")
        .expect("the ITL family");
    assert_eq!(itl.r#type, 4, "histogram");
    for point in ["ingress", "egress"] {
        let metric = itl
            .metric
            .iter()
            .find(|m| {
                m.label
                    .iter()
                    .any(|l| l.name == "point" && l.value == point)
            })
            .unwrap();
        let h = metric.histogram.as_ref().unwrap();
        let labels = [("route", "chat"), ("model", "test-model"), ("point", point)];
        assert_eq!(h.sample_count, 29, "{point}: 29 gaps");
        assert_eq!(
            h.sample_count as f64,
            text.value("metronome_inter_token_latency_seconds_count", &labels)
        );
        for bucket in &h.bucket {
            let le = format!("{}", bucket.upper_bound);
            let le_labels = [labels[0], labels[1], labels[2], ("le", le.as_str())];
            assert_eq!(
                bucket.cumulative_count as f64,
                text.value("metronome_inter_token_latency_seconds_bucket", &le_labels),
                "{point} le={le}"
            );
        }
        // Native: schema 4, every gap in a bucket, no bucket empty.
        assert_eq!(h.schema, 4);
        let mut count = 0i64;
        let mut native = h.zero_count;
        for delta in &h.positive_delta {
            count += delta;
            assert!(count > 0, "a listed native bucket holds a gap");
            native += count as u64;
        }
        assert_eq!(native, 29, "{point}: native buckets hold every gap");
        let spans: u32 = h.positive_span.iter().map(|s| s.length).sum();
        assert_eq!(spans as usize, h.positive_delta.len());
        // The 300 ms stall is in the native bucket that holds 0.3 s or a little more.
        let top = h.positive_span.iter().fold((0i32, 0i32), |(end, _), s| {
            let start = end + s.offset;
            (start + s.length as i32, start + s.length as i32 - 1)
        });
        let upper = 2f64.powf(f64::from(top.1) / 16.0);
        assert!(
            (0.29..0.45).contains(&upper),
            "the longest gap's bucket ends at {upper}"
        );
        // The exemplar: the stream's longest gap, with its IDs.
        let exemplar = h.exemplars.first().expect("an exemplar on ITL");
        let stream_id = exemplar
            .label
            .iter()
            .find(|l| l.name == "stream_id")
            .unwrap();
        assert_eq!(stream_id.value, id);
        let trace_id = exemplar
            .label
            .iter()
            .find(|l| l.name == "trace_id")
            .unwrap();
        assert_eq!(trace_id.value, TRACE_ID);
        assert!((0.29..0.6).contains(&exemplar.value), "{}", exemplar.value);
        assert!(exemplar.timestamp.is_some());
    }
    let counters = families
        .iter()
        .find(|f| f.name == "metronome_streams_total")
        .unwrap();
    assert_eq!(counters.r#type, 0);
    let streams: f64 = counters
        .metric
        .iter()
        .map(|m| m.counter.as_ref().unwrap().value)
        .sum();
    assert_eq!(streams, 1.0);

    // OpenMetrics: Python's prometheus_client parser takes it, and the stall's bucket carries
    // the stream's exemplar.
    let (content_type, body) = get(proxy.admin_addr, "/metrics", &[("accept", OPENMETRICS)]).await;
    assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"));
    let parsed = parse_openmetrics(&body);
    let families = parsed.as_array().unwrap();
    let stall = families
        .iter()
        .find(|f| f["name"] == "metronome_stall_duration_seconds")
        .expect("the stall family");
    assert_eq!(stall["type"], "histogram");
    assert_eq!(stall["unit"], "seconds");
    let with_exemplar: Vec<_> = stall["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["exemplar"].is_null())
        .collect();
    assert_eq!(with_exemplar.len(), 2, "one stall at each point");
    for sample in with_exemplar {
        let exemplar = &sample["exemplar"];
        assert_eq!(exemplar["labels"]["stream_id"], id.as_str());
        assert_eq!(exemplar["labels"]["trace_id"], TRACE_ID);
        let value = exemplar["value"].as_f64().unwrap();
        let le: f64 = sample["labels"]["le"].as_str().unwrap().parse().unwrap();
        assert!(
            (0.29..0.6).contains(&value) && value <= le,
            "{value} in le={le}"
        );
    }
    let streams = families
        .iter()
        .find(|f| f["name"] == "metronome_streams")
        .unwrap();
    assert_eq!(streams["type"], "counter");
    let created = stall["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "metronome_stall_duration_seconds_created")
        .count();
    assert_eq!(created, 2);
    // The stall exemplar's stream resolves at /streams/{id}.
    let (_, detail) = get(proxy.admin_addr, &format!("/streams/{id}"), &[]).await;
    assert!(String::from_utf8_lossy(&detail).contains(&id));
    proxy.shutdown().await;
}

/// A counter family with exemplars (the batch counters' kind): the OpenMetrics text with the
/// exemplar on a `_total` sample parses with prometheus_client, which gives back the stream, the
/// trace and the increment, and the text format 0.0.4 has no exemplar.
#[test]
fn counter_exemplars_parse_with_prometheus_client() {
    use metronome::metrics::{Buckets, CounterExemplar, CounterFamily, ModelLabels};
    let metrics =
        metronome::metrics::Metrics::new(&Buckets::default(), ModelLabels::new(&[], 8), ms(500))
            .unwrap();
    let family = CounterFamily::new(
        "metronome_hitches_total",
        "Hitches.",
        &["route", "model", "scope"],
    )
    .unwrap();
    metrics.register_counter(&family).unwrap();
    let exemplar = CounterExemplar {
        stream_id: "0123456789abcdef0123456789abcdef",
        trace_id: Some(TRACE_ID),
        rank: 0.3,
    };
    family.inc(&["chat", "m", "stream"], Some(&exemplar));
    family.inc(&["chat", "m", "batch"], None);

    let parsed = parse_openmetrics(metrics.encode_openmetrics().as_bytes());
    let hitches = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "metronome_hitches")
        .expect("the hitches family");
    assert_eq!(hitches["type"], "counter");
    let samples = hitches["samples"].as_array().unwrap();
    let stream = samples
        .iter()
        .find(|s| s["labels"]["scope"] == "stream")
        .unwrap();
    assert_eq!(stream["name"], "metronome_hitches_total");
    assert_eq!(stream["value"], 1.0);
    let e = &stream["exemplar"];
    assert_eq!(e["labels"]["stream_id"], exemplar.stream_id);
    assert_eq!(e["labels"]["trace_id"], TRACE_ID);
    assert_eq!(e["value"], 1.0, "the increment");
    assert!(e["timestamp"].as_f64().unwrap() > 1.0e9);
    let batch = samples
        .iter()
        .find(|s| s["labels"]["scope"] == "batch")
        .unwrap();
    assert!(batch["exemplar"].is_null());
    assert!(
        !metrics.encode().contains(" # "),
        "no exemplar in text 0.0.4"
    );
}
