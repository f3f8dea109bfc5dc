//! `/streams`, `/streams/{id}` and the browser beacon, against the real proxy.

use crate::support;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use metronome::proxy::ProxyHandle;
use support::*;

/// `metronome_beacons_total{result}`.
fn beacons(m: &Metrics, result: &str) -> f64 {
    m.value("metronome_beacons_total", &[("result", result)])
}

/// Requests the scripted upstream has received (beacons must never be among them).
fn forwarded(upstream: &RunningUpstream) -> usize {
    upstream
        .stats
        .requests
        .load(std::sync::atomic::Ordering::SeqCst)
}

const BEACON: &str = "/.well-known/metronome/beacon";

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

async fn post(addr: SocketAddr, path: &str, body: Vec<u8>) -> u16 {
    post_with(&client(), addr, path, body).await
}

async fn post_with(client: &Client, addr: SocketAddr, path: &str, body: Vec<u8>) -> u16 {
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "text/plain;charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = client.request(req).await.unwrap();
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

/// Streams one chat through the proxy and waits until the proxy has recorded it (its summary,
/// timeline and metrics are in place); returns what the client got and the stream's id.
async fn recorded_stream(proxy: &ProxyHandle) -> (Received, String) {
    let got = stream_chat(proxy.proxy_addr).await;
    let id = got.stream_id();
    scrape_after_stream(proxy).await;
    (got, id)
}

fn beacon(id: &str, ttft_ms: f64, gaps_ms: &[f64]) -> Vec<u8> {
    serde_json::json!({"v": 1, "id": id, "ttft_ms": ttft_ms, "gaps_ms": gaps_ms})
        .to_string()
        .into_bytes()
}

/// A beacon carrying `key`.
fn keyed(id: &str, key: &str, ttft_ms: f64, gaps_ms: &[f64]) -> Vec<u8> {
    serde_json::json!({"v": 1, "id": id, "key": key, "ttft_ms": ttft_ms, "gaps_ms": gaps_ms})
        .to_string()
        .into_bytes()
}

/// The beacon key the proxy gave a response.
fn key_of(got: &Received) -> String {
    got.headers["x-metronome-beacon-key"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_finished_stream_has_a_summary_and_a_frame_timeline() {
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(20))
        .stall_before(5, ms(250))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let (got, id) = recorded_stream(&proxy).await;

    let (status, list) = status_and_json(proxy.admin_addr, "/streams").await;
    assert_eq!(status, 200);
    let summary = &list["streams"][0];
    assert_eq!(summary["id"], id.as_str());
    assert_eq!(summary["route"], "chat");
    assert_eq!(summary["model"], "test-model");
    assert_eq!(summary["outcome"], "complete");
    assert_eq!(summary["frames"], 14); // role, 10 tokens, finish, usage, [DONE]
    assert_eq!(summary["token_events"], 10);
    assert_eq!(summary["output_tokens"], 10);
    assert_eq!(summary["stalls"]["ingress"], 1);
    assert_eq!(summary["stalls"]["egress"], 1);
    assert!(summary["itl_p99_us"]["ingress"].as_u64().unwrap() > 200_000);

    let (status, detail) = status_and_json(proxy.admin_addr, &format!("/streams/{id}")).await;
    assert_eq!(status, 200);
    let frames = detail["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 14);
    let tokens: u64 = frames
        .iter()
        .map(|f| f["token_events"].as_u64().unwrap())
        .sum();
    assert_eq!(tokens, 10);
    // Frame sizes (one token's length per SSE frame) are not shown by default.
    assert!(
        frames.iter().all(|f| f.get("bytes").is_none()),
        "frame sizes shown without timeline.frame_sizes: {frames:?}"
    );
    assert!(!got.bytes().is_empty());
    for pair in frames.windows(2) {
        assert!(pair[0]["ingress_us"].as_u64() <= pair[1]["ingress_us"].as_u64());
    }
    for f in frames {
        let (ingress, egress) = (
            f["ingress_us"].as_u64().unwrap(),
            f["egress_us"].as_u64().unwrap(),
        );
        assert!(egress >= ingress, "egress is after ingress: {f}");
    }
    // The stall: the gap before the 5th token frame (frame index 5) is over 200 ms at both points.
    let gap = |i: usize, key: &str| {
        frames[i][key].as_u64().unwrap() - frames[i - 1][key].as_u64().unwrap()
    };
    assert!(gap(5, "ingress_us") > 200_000);
    assert!(gap(5, "egress_us") > 200_000);

    let (status, missing) = status_and_json(proxy.admin_addr, "/streams/0000").await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["type"], "not_found");
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_ring_and_the_frames_are_bounded() {
    let upstream = Upstream::openai_chat()
        .tokens(20)
        .every(ms(5))
        .start()
        .await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.timeline.max_streams = 2;
        c.timeline.max_frames = 5;
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let got = stream_chat(proxy.proxy_addr).await;
        ids.push(got.stream_id());
    }
    scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) == 3.0).await;
    let (_, list) = status_and_json(proxy.admin_addr, "/streams").await;
    let listed: Vec<&str> = list["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        vec![ids[2].as_str(), ids[1].as_str()],
        "newest first, two kept"
    );
    // The upstream writes 24 frames; on a loaded machine some arrive together and are read as
    // one, so the count read is the stream's own.
    let read = list["streams"][0]["frames"].as_u64().unwrap();
    assert!((6..=24).contains(&read), "{read} frames read");
    let (_, detail) = status_and_json(proxy.admin_addr, &format!("/streams/{}", ids[2])).await;
    assert_eq!(detail["frames"].as_array().unwrap().len(), 5);
    assert_eq!(detail["frames_dropped"], read - 5);
    assert_eq!(
        status_and_json(proxy.admin_addr, &format!("/streams/{}", ids[0]))
            .await
            .0,
        404
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_beacon_is_recorded_at_the_client_point_once() {
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(5))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let (got, id) = recorded_stream(&proxy).await;
    let key = key_of(&got);

    // Nine gaps as a page saw them: clumps (0), a 300 ms stall.
    let gaps = [0.0, 0.0, 40.0, 300.0, 10.0, 0.0, 20.0, 20.0, 20.0];
    assert_eq!(
        post(proxy.proxy_addr, BEACON, keyed(&id, &key, 123.0, &gaps)).await,
        204
    );
    assert_eq!(
        post(proxy.proxy_addr, BEACON, keyed(&id, &key, 123.0, &gaps)).await,
        400,
        "once per stream"
    );

    let m = scrape(&proxy).await;
    let client = [
        ("route", "chat"),
        ("model", "test-model"),
        ("point", "client"),
    ];
    assert_eq!(
        m.value("metronome_inter_token_latency_seconds_count", &client),
        9.0
    );
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_bucket",
            &[client[0], client[1], client[2], ("le", "0.001")]
        ),
        3.0,
        "the three clumped events"
    );
    assert_eq!(m.value("metronome_stalls_total", &client), 1.0);
    assert_eq!(
        m.value("metronome_time_to_first_token_seconds_count", &client),
        1.0
    );
    assert_eq!(m.value("metronome_stream_jank_ratio_count", &client), 1.0);
    assert_eq!(beacons(&m, "accepted"), 1.0);
    assert_eq!(beacons(&m, "duplicate"), 1.0);
    assert_eq!(forwarded(&upstream), 1, "never forwarded");
    proxy.shutdown().await;
}

#[tokio::test]
async fn forged_beacons_are_refused_and_record_nothing_then_the_owners_is_accepted() {
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(5))
        .start()
        .await;
    let proxy = proxy_to(upstream.addr).await;
    let (got, id) = recorded_stream(&proxy).await;
    let (other, _) = recorded_stream(&proxy).await;
    let key = key_of(&got);
    let addr = proxy.proxy_addr;
    // The key is never published: not in /streams, /streams/{id} or /metrics.
    for path in [
        "/streams".to_owned(),
        format!("/streams/{id}"),
        "/metrics".to_owned(),
    ] {
        let text = String::from_utf8(
            request(proxy.admin_addr, "GET", &path, "", false)
                .await
                .bytes(),
        )
        .unwrap();
        assert!(!text.contains(&key), "{path} shows the key");
    }
    let gaps = [5.0; 9];
    // No key, another stream's key, a made-up key.
    assert_eq!(post(addr, BEACON, beacon(&id, 10.0, &gaps)).await, 403);
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key_of(&other), 10.0, &gaps)).await,
        403
    );
    assert_eq!(
        post(addr, BEACON, keyed(&id, &"0".repeat(32), 10.0, &gaps)).await,
        403
    );
    assert_eq!(
        post(addr, BEACON, keyed(&id, "not-a-key", 10.0, &gaps)).await,
        403
    );
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "no_key"), 1.0);
    assert_eq!(beacons(&m, "wrong_key"), 3.0);
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "client")]
        ),
        0.0,
        "nothing recorded"
    );
    // The owner's beacon still has the stream's one place.
    assert_eq!(post(addr, BEACON, keyed(&id, &key, 10.0, &gaps)).await, 204);
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "accepted"), 1.0);
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "client")]
        ),
        9.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn implausible_beacons_are_refused_then_the_streams_own_is_accepted() {
    let upstream = Upstream::openai_chat().tokens(3).every(ms(5)).start().await;
    let proxy = proxy_to(upstream.addr).await;
    let (got, id) = recorded_stream(&proxy).await;
    let key = key_of(&got);
    let addr = proxy.proxy_addr;
    // 1,900 gaps of an hour's worth for a stream of 3 token events.
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key, 10.0, &vec![3_600.0; 1_900])).await,
        422
    );
    // An hour-long gap; a TTFT past the stream's length plus the 10 s margin.
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key, 10.0, &[3_600_000.0, 5.0])).await,
        422
    );
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key, 20_000.0, &[5.0, 5.0])).await,
        422
    );
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "too_many_gaps"), 1.0);
    assert_eq!(beacons(&m, "too_long"), 2.0);
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "client")]
        ),
        0.0
    );
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key, 12.0, &[5.0, 6.0])).await,
        204
    );
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "accepted"), 1.0);
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "client")]
        ),
        2.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn bad_beacons_are_refused_counted_and_grow_nothing() {
    let upstream = Upstream::openai_chat().tokens(3).every(ms(1)).start().await;
    let proxy = proxy_with(upstream.addr, |c| c.timeline.beacon_max_bytes = 1024).await;
    let (got, id) = recorded_stream(&proxy).await;
    let key = key_of(&got);
    let addr = proxy.proxy_addr;

    assert_eq!(
        post(addr, BEACON, beacon("ffffffff000000000001", 1.0, &[1.0])).await,
        400
    );
    assert_eq!(post(addr, BEACON, b"{not json".to_vec()).await, 400);
    assert_eq!(
        post(addr, BEACON, br#"{"v":2,"id":"x"}"#.to_vec()).await,
        400
    );
    assert_eq!(post(addr, BEACON, beacon(&id, -5.0, &[1.0])).await, 400);
    assert_eq!(
        post(addr, BEACON, beacon(&id, 1.0, &vec![1.0; 2000])).await,
        413
    );
    let before = scrape(&proxy).await;
    let series_before = before.0.lines().filter(|l| !l.starts_with('#')).count();

    // A flood of 10,000 beacons for streams that do not exist.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            tokio::spawn(async move {
                let client = client();
                for i in 0..1250 {
                    let status = post_with(
                        &client,
                        addr,
                        BEACON,
                        beacon(&format!("{t:08x}{i:012x}"), 1.0, &[1.0, 2.0]),
                    )
                    .await;
                    assert_eq!(status, 400);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = scrape(&proxy).await;
    let series_after = after.0.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(
        series_after, series_before,
        "no new series from rejected beacons"
    );
    assert_eq!(
        after.value("metronome_beacons_total", &[("result", "unknown_stream")]),
        10_001.0
    );
    assert_eq!(
        after.value("metronome_beacons_total", &[("result", "malformed")]),
        3.0
    );
    assert_eq!(
        after.value("metronome_beacons_total", &[("result", "too_large")]),
        1.0
    );
    assert_eq!(
        after.get(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "client")]
        ),
        None
    );
    // The stream's own beacon still works after the flood.
    assert_eq!(
        post(addr, BEACON, keyed(&id, &key, 1.0, &[1.0, 2.0])).await,
        204
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn beacons_can_be_turned_off_and_then_are_proxied() {
    let upstream = Upstream::json("{}").start().await;
    let proxy = proxy_with(upstream.addr, |c| c.timeline.beacon_path = String::new()).await;
    assert_eq!(
        post(proxy.proxy_addr, BEACON, beacon("x", 1.0, &[])).await,
        200
    );
    assert_eq!(forwarded(&upstream), 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_admin_listener_serves_the_beacon_module() {
    let upstream = Upstream::json("{}").start().await;
    let proxy = proxy_to(upstream.addr).await;
    let got = request(proxy.admin_addr, "GET", "/metronome-beacon.js", "", false).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.headers["content-type"],
        "text/javascript; charset=utf-8"
    );
    let body = String::from_utf8(got.bytes()).unwrap();
    assert_eq!(body, include_str!("../../assets/metronome-beacon.js"));
    assert!(body.contains("metronomeFetch"));
    proxy.shutdown().await;
}

/// `timeline.frame_sizes = true` shows each frame's size, and they add up to the bytes
/// the client received.
#[tokio::test]
async fn frame_sizes_are_shown_when_opted_in() {
    let upstream = Upstream::openai_chat().tokens(10).start().await;
    let proxy = proxy_with(upstream.addr, |config| config.timeline.frame_sizes = true).await;
    let (got, id) = recorded_stream(&proxy).await;
    let (status, detail) = status_and_json(proxy.admin_addr, &format!("/streams/{id}")).await;
    assert_eq!(status, 200);
    let frames = detail["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 14);
    let bytes: u64 = frames.iter().map(|f| f["bytes"].as_u64().unwrap()).sum();
    assert_eq!(bytes as usize, got.bytes().len());
    proxy.shutdown().await;
}

/// The ID the old scheme (a process prefix and a sequence number) gave the stream after `id`:
/// the whole ID read as one hex number, plus one.
fn next_in_sequence(id: &str) -> String {
    let n = u128::from_str_radix(id, 16).expect("a stream ID is hex");
    format!("{:0width$x}", n + 1, width = id.len())
}

#[tokio::test]
async fn a_client_cannot_guess_the_next_streams_id_and_claim_its_beacon() {
    let upstream = Upstream::openai_chat().tokens(3).every(ms(1)).start().await;
    let proxy = proxy_to(upstream.addr).await;
    let (_, mine) = recorded_stream(&proxy).await;
    let (their_response, theirs) = recorded_stream(&proxy).await;

    // The attacker posts for the ID that follows its own: no stream has it.
    let guess = next_in_sequence(&mine);
    assert_ne!(guess, theirs, "the next ID follows from the last");
    assert_eq!((mine.len(), theirs.len()), (32, 32), "{mine} {theirs}");
    assert_eq!(
        post(proxy.proxy_addr, BEACON, beacon(&guess, 1.0, &[1.0])).await,
        400
    );
    // The real page's beacon is still its own.
    assert_eq!(
        post(
            proxy.proxy_addr,
            BEACON,
            keyed(&theirs, &key_of(&their_response), 1.0, &[1.0])
        )
        .await,
        204
    );
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "unknown_stream"), 1.0);
    assert_eq!(beacons(&m, "accepted"), 1.0);
    // `/streams/{id}` still finds a stream by its (longer) ID.
    assert_eq!(
        status_and_json(proxy.admin_addr, &format!("/streams/{theirs}"))
            .await
            .0,
        200
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_beacon_takes_a_place_under_max_requests_and_is_counted_when_refused() {
    // One stream holds the one place for about a second.
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(100))
        .start()
        .await;
    let proxy = proxy_with(upstream.addr, |c| c.limits.max_requests = 1).await;
    let addr = proxy.proxy_addr;
    let stream = tokio::spawn(stream_chat(addr));
    let state = proxy.state.clone();
    wait_until(
        std::time::Duration::from_secs(5),
        "the stream in flight",
        || state.requests_in_flight.available_permits() == 0,
    )
    .await;
    assert_eq!(
        post(
            addr,
            BEACON,
            beacon("00000000000000000000000000000001", 1.0, &[1.0])
        )
        .await,
        503
    );
    let got = stream.await.unwrap();
    assert_eq!(got.status, 200);
    let id = got.stream_id();
    let key = key_of(&got);
    scrape_after_stream(&proxy).await;
    wait_until(std::time::Duration::from_secs(5), "the place freed", || {
        state.requests_in_flight.available_permits() == 1
    })
    .await;
    // With the place free again, the stream's own beacon is taken.
    assert_eq!(post(addr, BEACON, keyed(&id, &key, 1.0, &[1.0])).await, 204);
    let m = scrape(&proxy).await;
    assert_eq!(beacons(&m, "overloaded"), 1.0);
    assert_eq!(beacons(&m, "accepted"), 1.0);
    assert_eq!(forwarded(&upstream), 1, "beacons are never forwarded");
    proxy.shutdown().await;
}
