//! `/streams?request_id=…&outcome=…&stalled=…&limit=…` against the real proxy: finding one
//! user's stream, and a 400 that names a bad parameter.

use crate::support;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use support::*;

/// One chat through the proxy carrying `x-request-id: id`, read to its end.
async fn chat_with_request_id(addr: SocketAddr, id: &str) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from_static(
            br#"{"model":"test-model","stream":true}"#,
        )))
        .unwrap();
    let response = client.request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await.unwrap();
}

fn ids(list: &serde_json::Value) -> Vec<String> {
    list["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn streams_filter_by_request_id_outcome_stall_and_limit() {
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(10))
        .stall_before(4, ms(250))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    for id in ["user-a", "user b/2", "user-c"] {
        chat_with_request_id(proxy.proxy_addr, id).await;
    }
    scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) >= 3.0).await;
    let (status, all) = status_and_json(proxy.admin_addr, "/streams").await;
    assert_eq!(status, 200);
    let all = ids(&all);
    assert_eq!(all.len(), 3, "{all:?}");

    // The one user's stream, by the ID their request carried (percent-encoded in the query).
    let (status, one) = status_and_json(proxy.admin_addr, "/streams?request_id=user+b%2F2").await;
    assert_eq!(status, 200);
    assert_eq!(
        ids(&one),
        [all[1].clone()],
        "newest first: user b/2 is the middle one"
    );
    let (_, none) = status_and_json(proxy.admin_addr, "/streams?request_id=user-z").await;
    assert!(ids(&none).is_empty());

    // Every stream stalled (250 ms before the 4th token) and completed.
    let (_, stalled) =
        status_and_json(proxy.admin_addr, "/streams?stalled=true&outcome=complete").await;
    assert_eq!(ids(&stalled), all);
    let (_, smooth) = status_and_json(proxy.admin_addr, "/streams?stalled=false").await;
    assert!(ids(&smooth).is_empty());
    let (_, cut) = status_and_json(proxy.admin_addr, "/streams?outcome=upstream_error").await;
    assert!(ids(&cut).is_empty());
    let (_, two) = status_and_json(proxy.admin_addr, "/streams?limit=2").await;
    assert_eq!(ids(&two), all[..2]);

    for (query, parameter) in [
        ("outcome=finished", "outcome"),
        ("stalled=1", "stalled"),
        ("limit=0", "limit"),
        ("request=x", "request"),
    ] {
        let (status, err) = status_and_json(proxy.admin_addr, &format!("/streams?{query}")).await;
        assert_eq!(status, 400, "{query}");
        assert_eq!(err["error"]["type"], "invalid_parameter");
        assert_eq!(err["error"]["parameter"], parameter, "{query}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(parameter), "{query}: {message}");
    }
    proxy.shutdown().await;
}
