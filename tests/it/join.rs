//! `probe --join`: the attribution of client gaps to generation, metronome and after metronome,
//! with timelines served by a tiny admin listener on 127.0.0.1 in the JSON of docs/timelines.md.
//!
//! The first test builds client records by hand, so every figure is exact; the others run real
//! streams (the library and the binary) and assert directions and rough sizes.

use crate::support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use metronome::probe::{
    attribute_run, attribute_run_with_rows, measure, AdminUrl, Load, ProbeConfig, ProbeRun, Read,
    Stop, StreamRecord, GAP_ROWS_CSV_HEADER,
};
use serde_json::{json, Value};
use support::{ms, Upstream};
use tokio::net::TcpListener;

/// What the fixture admin listener answers for each stream ID (anything else is a 404).
type Answers = HashMap<String, (u16, String)>;

/// Serves `GET /streams/{id}` from `answers` on 127.0.0.1:0, on the current runtime.
async fn admin(answers: Answers) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answers = Arc::new(answers);
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let answers = answers.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let answers = answers.clone();
                    async move { Ok::<_, Infallible>(answer(&answers, &req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    addr
}

fn answer(answers: &Answers, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let id = req.uri().path().strip_prefix("/streams/").unwrap_or("");
    let (status, body) = answers.get(id).cloned().unwrap_or_else(|| {
        let body = json!({"error": {"type": "not_found", "message": "unknown stream"}});
        (404, body.to_string())
    });
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// The admin listener on a runtime of its own thread (for the binary's test).
fn admin_in_background(answers: Answers) -> SocketAddr {
    support::in_background(|started| async move {
        started.send(admin(answers).await).unwrap();
        std::future::pending::<()>().await;
    })
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// A frame of the contract JSON.
fn frame(ingress_us: u64, egress_us: u64, events: u32, token_events: u32) -> Value {
    json!({"ingress_us": ingress_us, "egress_us": egress_us, "bytes": 230,
           "events": events, "token_events": token_events})
}

/// A timeline: role frame at 5 ms, token frames at the given ingress and egress stamps, and a
/// tail frame (finish and `[DONE]`) 1 ms after the last.
fn timeline(id: &str, tokens: &[(u64, u64)]) -> String {
    let mut frames = vec![frame(5_000, 5_020, 1, 0)];
    frames.extend(tokens.iter().map(|(i, e)| frame(*i, *e, 1, 1)));
    let (last_i, last_e) = tokens.last().copied().unwrap_or((5_000, 5_020));
    frames.push(frame(last_i + 1_000, last_e + 1_000, 2, 0));
    json!({"id": id, "route": "chat", "model": "m", "outcome": "complete",
           "started_unix_ms": 1_764_430_000_123u64, "content_type": "text/event-stream",
           "traceparent": null, "request_id": null, "frames": frames, "frames_dropped": 0})
    .to_string()
}

/// A client record, sent at `t0`, whose reads arrive at these offsets (microseconds from the
/// send) with these token events; a role read comes first and a tail read last.
fn client(t0: Instant, index: u64, id: Option<&str>, reads: &[(u64, u32)]) -> StreamRecord {
    let mut r = StreamRecord::new(index, t0);
    r.sent = Some(t0);
    r.stream_id = id.map(str::to_owned);
    let mut push = |at: u64, events: u32, token_events: u32| {
        r.reads.push(Read {
            at: t0 + us(at),
            events,
            token_events,
        });
    };
    push(5_520, 1, 0);
    for (at, n) in reads {
        push(*at, *n, *n);
    }
    let last = reads.last().map_or(5_520, |(at, _)| *at);
    push(last + 1_000, 2, 0);
    r.token_times = r
        .reads
        .iter()
        .flat_map(|read| std::iter::repeat_n(read.at, read.token_events as usize))
        .collect();
    r.counted_tokens = r.token_times.len() as u64;
    r.finished = r.reads.last().map(|read| read.at);
    r
}

/// Ten token events generated every 30 ms (token k at 30·(k+1) ms), metronome adding 20 us.
fn steady() -> Vec<(u64, u64)> {
    (0..10u64)
        .map(|k| (30_000 * (k + 1), 30_000 * (k + 1) + 20))
        .collect()
}

/// Each token event read alone, 500 us after it left metronome.
fn on_time(stamps: &[(u64, u64)]) -> Vec<(u64, u32)> {
    stamps.iter().map(|(_, e)| (e + 500, 1)).collect()
}

#[tokio::test]
async fn known_generation_metronome_and_edge_shares_are_attributed_exactly() {
    // Stream g: the upstream stalls 200 ms before token 5; nothing else happens.
    let mut gen = steady();
    for stamp in &mut gen[5..] {
        stamp.0 += 200_000;
        stamp.1 += 200_000;
    }
    // Stream m: metronome holds token 5 for 20 ms.
    let mut met = steady();
    met[5].1 += 20_000;
    // Stream e: an edge holds tokens 3, 4 and 5 and releases them with token 6.
    let edge = steady();
    let mut edge_reads = on_time(&edge);
    edge_reads.drain(3..6);
    edge_reads[3].1 = 4;

    let t0 = Instant::now();
    let streams = vec![
        client(t0, 0, Some("g"), &on_time(&gen)),
        client(t0, 1, Some("m"), &on_time(&met)),
        client(t0, 2, Some("e"), &edge_reads),
        client(t0, 3, Some("gone"), &on_time(&steady())),
        client(t0, 4, None, &on_time(&steady())),
        client(t0, 5, Some("bad"), &on_time(&steady())),
    ];
    let answers = Answers::from([
        ("g".to_owned(), (200, timeline("g", &gen))),
        ("m".to_owned(), (200, timeline("m", &met))),
        ("e".to_owned(), (200, timeline("e", &edge))),
        (
            "bad".to_owned(),
            (200, "{\"id\": \"bad\", \"frames\": 7}".to_owned()),
        ),
    ]);
    let addr = admin(answers).await;
    let run = ProbeRun {
        started: t0,
        finished: t0 + ms(500),
        streams,
    };
    let admin_url = AdminUrl::parse(&format!("http://{addr}")).unwrap();
    let (a, rows) = attribute_run_with_rows(&admin_url, &run).await;

    // `probe --gaps-csv`: one row per matched gap, in stream and event order; g's stall is the
    // gap that ends at its token event 5, which reached the client 380.52 ms into the run.
    assert_eq!(rows.len(), 27);
    let stall = rows.iter().find(|r| r.stream == 0 && r.event == 5).unwrap();
    assert_eq!(
        stall.csv_line(),
        "0,5,380520,230000,230000,0,0\n",
        "{stall:?}"
    );
    assert_eq!(rows.iter().filter(|r| r.stream == 0).count(), 9);
    assert!(rows
        .windows(2)
        .all(|w| (w[0].stream, w[0].event) < (w[1].stream, w[1].event)));
    assert_eq!(
        GAP_ROWS_CSV_HEADER,
        "stream,event,client_at_us,client_us,generation_us,metronome_us,after_metronome_us\n"
    );

    assert_eq!(a.streams_joined, 3);
    assert_eq!(a.streams_not_joined.not_found, 1);
    assert_eq!(a.streams_not_joined.no_stream_id, 1);
    assert_eq!(a.streams_not_joined.fetch_error, 1);
    assert_eq!(a.streams_not_joined.no_token_events, 0);
    assert_eq!(a.token_count_mismatches, 0);
    assert!(a.detail.examples["fetch_error"].contains("not a stream timeline"));
    assert!(a.detail.examples["not_found"].contains("/streams/gone"));
    assert_eq!(a.gaps, 27);
    // Sorted client gaps: 0 ×3 (edge clump), 10 ms (m, after the hold), 30 ms ×20, 50 ms (m's
    // hold), 120 ms (the edge's release), 230 ms (g's stall). Ties keep stream order.
    let split = |s: metronome::probe::attribution::GapSplit| {
        (s.client, s.generation, s.metronome, s.after_metronome)
    };
    assert_eq!(split(a.gap_ms.p50.unwrap()), (30.0, 30.0, 0.0, 0.0));
    assert_eq!(split(a.gap_ms.p95.unwrap()), (120.0, 30.0, 0.0, 90.0));
    assert_eq!(split(a.gap_ms.p99.unwrap()), (230.0, 230.0, 0.0, 0.0));
    // 1010 ms of waiting in all: 20 ms of it added by metronome, 90 ms after it.
    assert_eq!(a.detail.client_wait_ms, 1010.0);
    assert_eq!(a.wait_share.metronome, Some(20.0 / 1010.0));
    assert_eq!(a.wait_share.after_metronome, Some(90.0 / 1010.0));
    let ttft = a.ttft_ms.p50.unwrap();
    assert_eq!(
        (
            ttft.client,
            ttft.generation,
            ttft.metronome,
            ttft.after_metronome,
            ttft.network
        ),
        (30.52, 30.0, 0.02, 0.0, 0.5)
    );
    assert_eq!(a.base_delay_ms.p50, Some(0.5));
    assert_eq!(a.base_delay_ms.max, Some(0.5));
    // Reads: 11 + 11 + 8 of one event... (29 ones, 3 twos, one four); frames: 33 ones, 3 twos.
    assert_eq!(a.clumping.events_per_read.mean, Some(39.0 / 33.0));
    assert_eq!(a.clumping.events_per_read.p95, Some(2.0));
    assert_eq!(a.clumping.events_per_frame.mean, Some(39.0 / 36.0));
    assert_eq!(a.clumping.events_per_frame.p95, Some(2.0));
}

/// Timelines for streams `s-0`..`s-{n-1}` of the scripted upstream below: one token event
/// generated every 30 ms (token k at 30·(k+1) ms), metronome adding 100 us.
fn upstream_timelines(n: u64, tokens: u64) -> Answers {
    let stamps: Vec<(u64, u64)> = (0..tokens)
        .map(|k| (30_000 * (k + 1), 30_000 * (k + 1) + 100))
        .collect();
    (0..n)
        .map(|i| {
            let id = format!("s-{i}");
            let body = timeline(&id, &stamps);
            (id, (200, body))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_streams_clumped_by_an_edge_are_attributed_after_metronome() {
    // The client sees what a buffering edge makes of a 30 ms cadence: four token events at a
    // time, every 120 ms. The timelines say they were generated one by one, every 30 ms.
    let upstream = Upstream::sse()
        .tokens(12)
        .first_after(ms(120))
        .every(ms(120))
        .per_frame(4)
        .stream_id()
        .start()
        .await;
    // Streams s-0..s-3 have timelines; s-4 is unknown to the admin listener.
    let addr = admin(upstream_timelines(4, 12)).await;
    let mut config = ProbeConfig::new(&upstream.url(), "m").unwrap();
    config.stop = Stop::Requests(5);
    config.load = Load::Closed { concurrency: 5 };
    config.timeout = Duration::from_secs(10);
    let run = measure(&config).await.unwrap();
    let admin_url = AdminUrl::parse(&format!("http://{addr}")).unwrap();
    let a = attribute_run(&admin_url, &run).await;
    eprintln!("{a:#?}");

    assert_eq!(a.streams_joined, 4);
    assert_eq!(a.streams_not_joined.not_found, 1);
    assert_eq!(a.gaps, 4 * 11);
    // The median gap is a clump: 0 at the client, 30 ms of generation taken away after metronome.
    let p50 = a.gap_ms.p50.unwrap();
    assert_eq!(
        (
            p50.client,
            p50.generation,
            p50.metronome,
            p50.after_metronome
        ),
        (0.0, 30.0, 0.0, -30.0)
    );
    // The tail is the release: about 120 ms at the client, 30 of generation, ~90 after.
    let p99 = a.gap_ms.p99.unwrap();
    assert_eq!((p99.generation, p99.metronome), (30.0, 0.0));
    assert!(
        (100.0..160.0).contains(&p99.client),
        "client p99 {}",
        p99.client
    );
    assert!(
        (70.0..130.0).contains(&p99.after_metronome),
        "after {}",
        p99.after_metronome
    );
    // 3 of every 4 waiting milliseconds came after metronome.
    let after = a.wait_share.after_metronome.unwrap();
    assert!(
        (0.6..0.85).contains(&after),
        "after-metronome share {after}"
    );
    assert_eq!(a.wait_share.metronome, Some(0.0));
    // The client reads four events at a time; the upstream framed them one by one (the timelines'
    // 14 frames per stream: role, 12 tokens, and a tail of two events).
    assert_eq!(a.clumping.events_per_read.p95, Some(4.0));
    let per_read = a.clumping.events_per_read.mean.unwrap();
    assert!(
        (2.5..=3.5).contains(&per_read),
        "events per read {per_read}"
    );
    assert_eq!(a.clumping.events_per_frame.mean, Some(15.0 / 14.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_real_proxy_every_stream_joins_and_the_gaps_are_generation() {
    // sim (steady 20 ms) -> metronome -> probe, then the timelines from metronome's own admin
    // listener: the contract between the lead's server side and this client, for real.
    let sim_config = metronome::sim::SimConfig {
        gap: ms(20),
        ttft: ms(20),
        tokens: 16,
        ..metronome::sim::SimConfig::default()
    };
    let sim =
        metronome::sim::spawn(TcpListener::bind("127.0.0.1:0").await.unwrap(), sim_config).unwrap();
    let proxy = support::proxy_to(sim.addr()).await;
    let url = format!("http://{}/v1/chat/completions", proxy.proxy_addr);
    let mut config = ProbeConfig::new(&url, "sim-model").unwrap();
    config.body = metronome::probe::args::chat_body("sim-model", "hi", 16);
    config.stop = Stop::Requests(4);
    config.load = Load::Closed { concurrency: 2 };
    config.timeout = Duration::from_secs(10);
    let run = measure(&config).await.unwrap();
    assert!(run.streams.iter().all(|s| s.stream_id.is_some()));
    let admin_url = AdminUrl::parse(&format!("http://{}", proxy.admin_addr)).unwrap();
    let a = attribute_run(&admin_url, &run).await;
    eprintln!("{a:#?}");

    assert_eq!(a.streams_joined, 4, "{:?}", a.detail.examples);
    assert_eq!(a.streams_not_joined, Default::default());
    assert_eq!(a.token_count_mismatches, 0);
    assert_eq!(a.gaps, 4 * 15);
    let p50 = a.gap_ms.p50.unwrap();
    assert!((15.0..40.0).contains(&p50.generation), "{p50:?}");
    for split in [a.gap_ms.p50, a.gap_ms.p95, a.gap_ms.p99] {
        // Nothing between metronome and the probe: whatever the sim's timers did (a busy machine
        // makes some gaps late), the client saw it as generation; metronome and what comes after
        // add a few ms at most.
        let g = split.unwrap();
        assert!(
            g.metronome.abs() < 10.0 && g.after_metronome.abs() < 10.0,
            "{g:?}"
        );
    }
    let after = a.wait_share.after_metronome.unwrap();
    assert!(after < 0.1, "after-metronome share {after}");
    // One event per read and per frame: nobody clumps.
    assert_eq!(a.clumping.events_per_frame.p95, Some(1.0));
    assert_eq!(a.clumping.events_per_read.p95, Some(1.0));
}

#[test]
fn the_binary_adds_an_attribution_object_only_with_join() {
    let upstream = Upstream::sse()
        .tokens(8)
        .every(ms(20))
        .stream_id()
        .start_in_background();
    let addr = admin_in_background(upstream_timelines(2, 8));
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], json: &std::path::Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_metronome"))
            .args(["probe", "--url", &upstream.url(), "-n", "2", "--json"])
            .arg(json)
            .args(extra)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let report: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        (String::from_utf8_lossy(&output.stdout).into_owned(), report)
    };
    let admin_url = format!("http://{addr}");
    let html = dir.path().join("joined.html");
    let (text, joined) = run(
        &["--join", &admin_url, "--html", html.to_str().unwrap()],
        &dir.path().join("joined.json"),
    );
    let (plain_text, plain) = run(&[], &dir.path().join("plain.json"));

    let keys = |v: &Value| {
        v.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<String>>()
    };
    let mut with = keys(&joined);
    with.retain(|k| k != "attribution");
    assert_eq!(with, keys(&plain));
    assert!(plain.get("attribution").is_none());
    assert!(!plain_text.contains("attribution"));
    let a = &joined["attribution"];
    assert_eq!(a["admin_url"], admin_url.as_str());
    // The scripted upstream numbers its streams from s-0 across both runs: the first run got
    // s-0 and s-1, which have timelines.
    assert_eq!(a["streams_joined"], 2, "{a:#}");
    assert_eq!(a["gaps"], 14);
    assert!(a["gap_ms"]["p50"]["generation"].is_number());
    assert!(a["clumping"]["events_per_frame"]["mean"].is_number());
    assert!(
        text.contains("attribution    2 of 2 streams joined with"),
        "{text}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Where the gaps come from"));

    let bad = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "--url", &upstream.url(), "--join", "https://x"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--join `https://x`"));
}
