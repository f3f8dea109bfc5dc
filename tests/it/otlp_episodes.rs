//! A stream's span names the batch episodes it was caught in (the OTLP traces of
//! docs/operations.md, with the batch detector of docs/batch.md): `metronome sim --engine batch` behind the proxy with `[otlp] traces = true`, and a
//! receiver here that decodes the OTLP/HTTP trace exports with the official protobufs.
//!
//! Four streams decode at a 20 ms step; one long prompt (3,000 tokens at 100 µs each) holds the
//! shared step for 300 ms, so every decoding stream hitches at once: one episode. Each decoding
//! stream's span must carry one `metronome.batch_episode` event for it, naming the episode
//! `/episodes` lists, with the stream's own hitch length; the long prompt, which was in its
//! prefill and not yet decoding, must not.
#![cfg(feature = "otlp")]

use crate::support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost014::Message;
use support::*;
use tokio::net::TcpListener;

const DECODING: usize = 4;
const GAP: u64 = 20;
const HOLD_MS: u64 = 300;
const LONG_AT: u64 = 600;

/// An OTLP/HTTP receiver on 127.0.0.1: every span of every `/v1/traces` export, decoded.
async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let spans = kept.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<_>| {
                    let spans = spans.clone();
                    async move {
                        let traces = req.uri().path() == "/v1/traces";
                        let body: Bytes = BodyExt::collect(req.into_body())
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        if traces {
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            let mut all = spans.lock().unwrap();
                            for rs in export.resource_spans {
                                for ss in rs.scope_spans {
                                    all.extend(ss.spans);
                                }
                            }
                        }
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(socket);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, spans)
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attr(attributes, key) {
        Some(AnyValue::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attributes, key) {
        Some(AnyValue::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn double(attributes: &[KeyValue], key: &str) -> Option<f64> {
    match attr(attributes, key) {
        Some(AnyValue::DoubleValue(d)) => Some(*d),
        _ => None,
    }
}

fn chat_body(max_tokens: u64, prompt_tokens: u64) -> String {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{max_tokens},"sim_prompt_tokens":{prompt_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_span_names_the_batch_episode_it_was_caught_in() {
    let (otlp, spans) = receiver().await;
    let sim = sim_with(batch_engine(ms(GAP))).await;
    let toml = format!(
        "{}\n[otlp]\nendpoint = \"http://{otlp}\"\ninterval = \"1s\"\ntraces = true\n",
        proxy_toml(sim.addr())
    );
    let proxy = ProxyHandle::start(Config::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let addr = proxy.proxy_addr;

    // Decode past the hold: 80 steps of 20 ms, the hold at 600 ms.
    let decoding = futures_util::future::join_all((0..DECODING).map(|i| async move {
        tokio::time::sleep(ms(5 * i as u64)).await;
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &chat_body(80, 1),
            false,
        )
        .await
    }));
    let long = async {
        tokio::time::sleep(ms(LONG_AT)).await;
        let body = chat_body(2, HOLD_MS * 10);
        request(addr, "POST", "/v1/chat/completions", &body, false).await
    };
    let (decoding, long) = tokio::join!(decoding, long);
    assert!(decoding
        .iter()
        .chain([&long])
        .all(|r| r.status == 200 && r.error.is_none()));

    // The episode the long prompt caused: the one whose latest arrival is the long prompt.
    let long_id = long.stream_id();
    let episodes = request(proxy.admin_addr, "GET", "/episodes", "", false).await;
    let episodes: serde_json::Value = serde_json::from_slice(&episodes.bytes()).unwrap();
    let caused: Vec<&serde_json::Value> = episodes["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["arrived"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["stream_id"] == long_id.as_str())
        })
        .collect();
    assert!(
        !caused.is_empty(),
        "no episode names the long prompt: {episodes}"
    );
    // A loaded machine may make the lookback of a later episode reach the long prompt too; the
    // episode it caused is the first after it.
    let episode = caused
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .min()
        .unwrap();

    // Every stream's span arrives within a few flushes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let by_stream: HashMap<String, Span> = loop {
        let got: HashMap<String, Span> = spans
            .lock()
            .unwrap()
            .iter()
            .filter_map(|s| Some((string(&s.attributes, "metronome.stream_id")?, s.clone())))
            .collect();
        if got.len() == DECODING + 1 || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(ms(100)).await;
    };
    assert_eq!(
        by_stream.len(),
        DECODING + 1,
        "spans of {:?}",
        by_stream.keys()
    );

    for got in &decoding {
        let span = &by_stream[&got.stream_id()];
        let caught: Vec<_> = span
            .events
            .iter()
            .filter(|e| e.name == "metronome.batch_episode")
            .filter(|e| int(&e.attributes, "metronome.batch.episode") == Some(episode as i64))
            .collect();
        assert_eq!(caught.len(), 1, "{:?}", span.events);
        let event = caught[0];
        assert_eq!(
            string(&event.attributes, "metronome.batch.upstream").as_deref(),
            Some("default")
        );
        let hitch = double(&event.attributes, "metronome.batch.hitch.length").unwrap();
        assert!(
            (0.25..2.0).contains(&hitch),
            "hitch of {hitch} s for a {HOLD_MS} ms hold"
        );
        let streams = int(&event.attributes, "metronome.batch.episode.streams").unwrap();
        assert!(streams >= 2, "{streams} streams caught");
        assert!(event.time_unix_nano > span.start_time_unix_nano);
        assert!(event.time_unix_nano < span.end_time_unix_nano);
    }
    let long_span = &by_stream[&long_id];
    assert!(
        !long_span.events.iter().any(|e| {
            e.name == "metronome.batch_episode"
                && int(&e.attributes, "metronome.batch.episode") == Some(episode as i64)
        }),
        "the prompt in prefill was not decoding: {:?}",
        long_span.events
    );
    proxy.shutdown().await;
    sim.shutdown().await.unwrap();
}
