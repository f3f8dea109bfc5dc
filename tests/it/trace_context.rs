//! The W3C trace context through the proxy with `[otlp] traces = true`: what the upstream gets
//! for the trace-context test suite's header cases (W3C trace-context, test/test.py), including
//! the ones a header parser alone cannot see (two `traceparent` fields, `tracestate` without a
//! continued parent).

#![cfg(feature = "otlp")]

use crate::support;

use std::io::{Read, Write};
use std::net::SocketAddr;

use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use support::*;

const ID: &str = "12345678901234567890123456789012";

/// The request's header fields, whether its trace is continued, and the `tracestate` the
/// upstream gets.
type Case<'a> = (&'a [(&'a str, &'a str)], bool, Option<&'a str>);

/// Sends one chat request with `fields` over HTTP/1.1 and reads the answer to its end.
fn send(proxy: SocketAddr, fields: &[(&str, &str)]) {
    let mut tcp = std::net::TcpStream::connect(proxy).unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    let mut head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in fields {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    write!(tcp, "{head}\r\n{body}").unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_a_continued_trace_only_from_one_valid_traceparent() {
    let upstream = Upstream::openai_chat().tokens(2).start().await;
    // The receiver is a closed port: exports fail, which changes nothing for the headers.
    let toml = format!(
        "{}\n[otlp]\nendpoint = \"http://127.0.0.1:9\"\ntraces = true\n",
        proxy_toml(upstream.addr)
    );
    let proxy = ProxyHandle::start(Config::from_toml(&toml).unwrap())
        .await
        .unwrap();
    let valid = "00-12345678901234567890123456789012-1234567890123456-00";
    let cases: &[Case] = &[
        (
            &[("traceparent", valid), ("tracestate", "foo=1,bar=2")],
            true,
            Some("foo=1,bar=2"),
        ),
        (&[("TrAcEpArEnT", valid)], true, None),
        (
            &[
                (
                    "traceparent",
                    "00-12345678901234567890123456789011-1234567890123456-01",
                ),
                ("traceparent", valid),
            ],
            false,
            None,
        ),
        (&[("trace-parent", valid)], false, None),
        (&[("tracestate", "foo=1")], false, None),
        (
            &[
                (
                    "traceparent",
                    "00-1234567890123456789012345678901A-1234567890123456-00",
                ),
                ("tracestate", "foo=1"),
            ],
            false,
            None,
        ),
        (
            &[
                (
                    "traceparent",
                    "cc-12345678901234567890123456789012-1234567890123456-01-future",
                ),
                ("tracestate", "foo=1"),
            ],
            true,
            Some("foo=1"),
        ),
    ];
    for (i, (fields, continued, tracestate)) in cases.iter().enumerate() {
        send(proxy.proxy_addr, fields);
        let seen = upstream.seen.lock().unwrap();
        let headers = &seen.headers[i];
        let parents: Vec<&str> = headers
            .get_all("traceparent")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(parents.len(), 1, "case {i}: {parents:?}");
        let trace = &parents[0][3..35];
        if *continued {
            assert_eq!(trace, ID, "case {i}: {fields:?}");
        } else {
            // A new trace: no ID the client sent, in any spelling.
            let sent = fields
                .iter()
                .any(|(_, v)| v.to_ascii_lowercase().contains(trace));
            assert!(!sent, "case {i}: {fields:?} -> {parents:?}");
        }
        assert_ne!(
            &parents[0][36..52],
            "1234567890123456",
            "case {i}: a new span"
        );
        let state = headers.get("tracestate").map(|v| v.to_str().unwrap());
        assert_eq!(state, *tracestate, "case {i}: {fields:?}");
    }
    proxy.shutdown().await;
}
