//! Model names an upstream sends to be misread: a right-to-left override, a zero-width space, a
//! byte-order mark, line and paragraph separators, a no-break space, a C1 control, padding, and
//! the reserved values. Each becomes `other` (or stays `unknown` for no name) in every
//! exposition, read by prometheus_client's parsers (text 0.0.4 and OpenMetrics), by promtool (text), and
//! decoded from protobuf, and in `/streams`; a clean name beside them keeps its label.

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use bytes::{Buf, Bytes};
use metronome::metrics::proto::MetricFamily;
use prost::Message;
use support::*;

const HOSTILE: &[&str] = &[
    "gpt\u{202e}4",
    "gpt-4\u{200b}",
    "\u{feff}llama",
    "line\u{2028}break",
    "para\u{2029}break",
    "no\u{a0}break",
    "c1\u{85}control",
    "del\u{7f}",
    " padded",
    "other",
    "unknown",
    "Unknown",
];
const CLEAN: &str = "good-model";
const PROTOBUF: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";
const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0";

/// The `model` values of a parsed exposition (scripts/check-openmetrics.py's JSON).
fn models_parsed(families: &serde_json::Value) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for family in families.as_array().unwrap() {
        for sample in family["samples"].as_array().unwrap() {
            if let Some(model) = sample["labels"]["model"].as_str() {
                found.insert(model.to_string());
            }
        }
    }
    found
}

/// `promtool check metrics` reads the exposition without an error.
fn promtool_reads(body: &[u8]) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("error"), "promtool: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misreadable_model_names_are_labelled_other_in_every_exposition() {
    let mut names: Vec<&str> = HOSTILE.to_vec();
    names.push(CLEAN);
    let upstreams = futures_util::future::join_all(
        names
            .iter()
            .map(|name| Upstream::openai_chat().model(name).tokens(2).start()),
    )
    .await;
    let proxy = proxy_to(upstreams[0].addr).await;
    for upstream in &upstreams {
        let mut config = (*proxy.state.live_config()).clone();
        let url = format!("http://{}", upstream.addr);
        config.server.upstream = metronome::config::Upstream::parse(&url).unwrap();
        config.routes.clear();
        metronome::proxy::reload::apply(&proxy.state, config);
        assert_eq!(stream_chat(proxy.proxy_addr).await.status, 200);
    }
    let n = names.len() as f64;
    scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) >= n).await;
    let expected: BTreeSet<String> = [CLEAN, "other"].iter().map(|s| s.to_string()).collect();

    let text = request(proxy.admin_addr, "GET", "/metrics", "", false)
        .await
        .bytes();
    assert_eq!(
        models_parsed(&parse_text_format(&text)),
        expected,
        "text 0.0.4"
    );
    promtool_reads(&text);

    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    let get = |accept: &'static str| {
        let request = http::Request::get(format!("http://{}/metrics", proxy.admin_addr))
            .header("accept", accept)
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(request);
        async move {
            use http_body_util::BodyExt;
            response
                .await
                .unwrap()
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
        }
    };
    // promtool's `check metrics` reads the text format only (an exemplar is a parse error to it).
    let openmetrics = get(OPENMETRICS).await;
    assert!(openmetrics.ends_with(b"# EOF\n"));
    assert_eq!(
        models_parsed(&parse_openmetrics(&openmetrics)),
        expected,
        "OpenMetrics"
    );

    let mut protobuf = get(PROTOBUF).await;
    let mut models = BTreeSet::new();
    while protobuf.has_remaining() {
        let family = MetricFamily::decode_length_delimited(&mut protobuf).unwrap();
        for metric in &family.metric {
            for label in metric.label.iter().filter(|l| l.name == "model") {
                models.insert(label.value.clone());
            }
        }
    }
    assert_eq!(models, expected, "protobuf");

    // `/streams` carries the same labels (its model is the stream's label, as logs and spans).
    let streams = request(proxy.admin_addr, "GET", "/streams", "", false)
        .await
        .bytes();
    let streams: serde_json::Value = serde_json::from_slice(&streams).unwrap();
    let shown: BTreeSet<String> = streams["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(shown, expected, "/streams");
    proxy.shutdown().await;
}
