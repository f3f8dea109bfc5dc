//! Counters never go backwards, whatever an upstream reports: a `usage` of 2^64-1 or a running
//! usage that shrinks is refused (counted in `metronome_unparsed_events_total` by reason), and
//! every counter of `/metrics` is compared scrape by scrape.

use crate::support;

use std::collections::BTreeMap;

use bytes::Bytes;
use support::*;

/// One chat stream: a token chunk, then a usage-only chunk for each `(prompt, completion)`.
fn stream_reporting(usages: &[(&str, &str)]) -> Vec<Bytes> {
    let chunk = |body: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",{body}}}\n\n"
        ))
    };
    let mut frames = vec![chunk(
        r#""choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]"#,
    )];
    for (prompt, completion) in usages {
        frames.push(chunk(&format!(
            r#""choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{completion}}}"#
        )));
    }
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// Every counter sample of a text scrape (`_total` series), by its full series name.
fn counters(m: &Metrics) -> BTreeMap<String, f64> {
    m.0.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next().unwrap().ends_with("_total"))
        .map(|(series, value)| (series.to_string(), value.parse().unwrap()))
        .collect()
}

const MAX: &str = "18446744073709551615";

#[tokio::test]
async fn a_usage_of_two_to_the_64_leaves_every_counter_monotonic() {
    let streams = [
        stream_reporting(&[("5", "10")]),
        stream_reporting(&[(MAX, MAX)]),
        stream_reporting(&[("5", "20"), ("5", "5")]),
        stream_reporting(&[("9223372036854775808", "100000001")]),
    ];
    let mut before = BTreeMap::new();
    let upstreams = futures_util::future::join_all(
        streams
            .iter()
            .map(|frames| Upstream::sse_frames(frames, ms(1)).start()),
    )
    .await;
    let proxy = proxy_to(upstreams[0].addr).await;
    for (i, upstream) in upstreams.iter().enumerate() {
        // One proxy, so every counter carries on: each stream's upstream is the default one.
        let mut config = (*proxy.state.live_config()).clone();
        let url = format!("http://{}", upstream.addr);
        config.server.upstream = metronome::config::Upstream::parse(&url).unwrap();
        config.routes.clear();
        metronome::proxy::reload::apply(&proxy.state, config);
        stream_chat(proxy.proxy_addr).await;
        let m = scrape_until(&proxy, |m| {
            m.value("metronome_streams_total", &[]) >= (i + 1) as f64
        })
        .await;
        let now = counters(&m);
        for (series, was) in &before {
            let is = now.get(series).copied().unwrap_or(0.0);
            assert!(is >= *was, "stream {i}: {series} went from {was} to {is}");
        }
        before = now;
    }
    let m = scrape(&proxy).await;
    let output = |source| m.value("metronome_output_tokens_total", &[("source", source)]);
    // 10 and 20 believed; 2^64-1 and 100,000,001 refused, so those streams count their 1 event.
    assert_eq!(output("usage"), 30.0);
    assert_eq!(output("counted"), 2.0);
    assert_eq!(m.value("metronome_prompt_tokens_total", &[]), 10.0);
    let refused = |reason| m.value("metronome_unparsed_events_total", &[("reason", reason)]);
    assert_eq!(
        refused("usage_over_bound"),
        4.0,
        "2^64-1 twice, 2^63 and 100,000,001"
    );
    assert_eq!(refused("usage_decreased"), 1.0);
    proxy.shutdown().await;
}
