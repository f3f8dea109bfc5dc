//! Batch-wide hitches (docs/batch.md) end to end: `metronome sim --engine batch` behind the proxy,
//! with the sim's `--timeline` as the truth of which gap was the batch's (another request's
//! prefill held the shared step) and which was the stream's own stall.
//!
//! Counts are exact where the schedule makes them so (ten long prompts, ten episodes, ten placed
//! stalls); time margins are generous (the batch's holds are 300 ms against 20 ms steps, and
//! each stall is placed 100 ms or more from any hold).

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use metronome::sim::{self, SimConfig};
use serde_json::Value;
use support::*;

/// Decoding streams, and the long-prompt requests that arrive among them.
const STREAMS: usize = 20;
const LONG_PROMPTS: usize = 10;
/// Stream-local stalls, each in a stream of its own.
const STALLS: usize = 10;
/// The loop's step; a long prompt's 3,000 tokens × 100 µs hold one step for 300 ms.
const GAP: u64 = 20;
const HOLD: u64 = 300;
const STALL: u64 = 120;
/// Long prompts arrive this far apart (ms), the first after `FIRST_LONG`.
const LONG_EVERY: u64 = 900;
const FIRST_LONG: u64 = 800;

/// Where the stream-local stalls go: `(stream, token event)` for `STALLS` streams, each at a
/// random time inside a stretch free of holds (with 100 ms to spare on each side), turned into
/// the token event that comes then: about one per `GAP` from the stream's start, less the
/// holds before it.
fn stall_plan(seed: u64) -> HashMap<usize, u64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut streams: Vec<usize> = (0..STREAMS).collect();
    let mut plan = HashMap::new();
    for _ in 0..STALLS {
        let stream = streams.swap_remove(rng.gen_range(0..streams.len()));
        let window = rng.gen_range(0..LONG_PROMPTS as u64);
        let at = match window {
            0 => rng.gen_range(300..550),
            j => FIRST_LONG + (j - 1) * LONG_EVERY + 450 + rng.gen_range(0..200),
        };
        let started = 5 * stream as u64 + 30;
        let event = (at - started - HOLD * window) / GAP;
        plan.insert(stream, event);
    }
    plan
}

fn chat_body(max_tokens: u64, prompt_tokens: u64, stall_at: Option<u64>) -> String {
    let stall = stall_at.map_or(String::new(), |n| format!(r#","sim_stall_at":{n}"#));
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":{max_tokens},"sim_prompt_tokens":{prompt_tokens}{stall},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// What the sim's timeline says about one stream's gaps, by the index of the token event that
/// ends each: held by the batch (another prompt's prefill), or the stream's own stall.
#[derive(Debug, Default)]
struct Truth {
    batch: HashSet<u64>,
    stall: HashSet<u64>,
}

fn truth_by_sim_stream(timeline: &str) -> HashMap<u64, Truth> {
    let mut by_stream: HashMap<u64, Truth> = HashMap::new();
    for line in timeline.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let (Some(stream), Some(event)) = (v["stream"].as_u64(), v["event"].as_u64()) else {
            continue;
        };
        if v["events"] == 0 || event == 0 {
            continue; // no token event, or the first (no gap before it)
        }
        let held = v["held_us"].as_u64().unwrap_or(0);
        let stalled = v["stalled_us"].as_u64().unwrap_or(0);
        let truth = by_stream.entry(stream).or_default();
        // A gap holding both is neither kind alone: left out of both counts.
        if held >= 100_000 && stalled == 0 {
            truth.batch.insert(event);
        } else if stalled > 0 && held < 1_000 {
            truth.stall.insert(event);
        }
    }
    by_stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_make_batch_hitches_and_stalls_stay_stream_scope() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.jsonl");
    let sim = sim_with(SimConfig {
        stall: ms(STALL),
        timeline: Some(path.clone()),
        ..batch_engine(ms(GAP))
    })
    .await;
    let proxy = proxy_to(sim.addr()).await;
    let addr = proxy.proxy_addr;

    let plan = stall_plan(29);
    // Enough tokens to decode past the last hold.
    let tokens = (FIRST_LONG + LONG_EVERY * LONG_PROMPTS as u64) / GAP + 20;
    let decoding = futures_util::future::join_all((0..STREAMS).map(|i| {
        let body = chat_body(tokens, 1, plan.get(&i).copied());
        async move {
            tokio::time::sleep(ms(5 * i as u64)).await;
            request(addr, "POST", "/v1/chat/completions", &body, false).await
        }
    }));
    let long = futures_util::future::join_all((0..LONG_PROMPTS).map(|i| async move {
        tokio::time::sleep(ms(FIRST_LONG + LONG_EVERY * i as u64)).await;
        let body = chat_body(2, HOLD * 10, None);
        request(addr, "POST", "/v1/chat/completions", &body, false).await
    }));
    let (decoding, long) = tokio::join!(decoding, long);
    assert!(decoding
        .iter()
        .chain(&long)
        .all(|r| r.status == 200 && r.error.is_none()));

    // Every hitch settles within a few sweeps of its end.
    let m = scrape_until(&proxy, |m| {
        m.value("metronome_batch_episodes_total", &[("upstream", "default")]) >= LONG_PROMPTS as f64
            && m.value("metronome_streams_total", &[]) == (STREAMS + LONG_PROMPTS) as f64
    })
    .await;
    tokio::time::sleep(ms(300)).await;
    let m2 = scrape(&proxy).await;
    // One episode per long prompt; a loaded machine pausing the sim's one decode loop is a
    // batch-wide hitch too, so any further episode must be one no long prompt caused (below).
    let episodes_counted = m2.value("metronome_batch_episodes_total", &[("upstream", "default")]);
    assert!(
        episodes_counted >= LONG_PROMPTS as f64,
        "{episodes_counted}"
    );
    assert_eq!(
        m.value("metronome_prompt_tokens_total", &[("route", "chat")]),
        (STREAMS as u64 + LONG_PROMPTS as u64 * HOLD * 10) as f64
    );
    sim.shutdown().await.unwrap();
    let timeline = std::fs::read_to_string(&path).unwrap();
    let truth = truth_by_sim_stream(&timeline);

    let (mut batch_total, mut batch_seen) = (0usize, 0usize);
    let (mut stall_total, mut stall_as_batch, mut stall_as_stream) = (0usize, 0usize, 0usize);
    for got in &decoding {
        let sim_seq: u64 = got.headers[sim::STREAM_HEADER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let detail = get_json(proxy.admin_addr, &format!("/streams/{}", got.stream_id())).await;
        let marks: HashMap<u64, String> = detail["hitches"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|h| {
                assert_eq!(h["phase"], "content", "{h}");
                (
                    h["event"].as_u64().unwrap(),
                    h["scope"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let t = &truth[&sim_seq];
        batch_total += t.batch.len();
        batch_seen += t
            .batch
            .iter()
            .filter(|e| marks.get(e).map(String::as_str) == Some("batch"))
            .count();
        stall_total += t.stall.len();
        stall_as_batch += t
            .stall
            .iter()
            .filter(|e| marks.get(e).map(String::as_str) == Some("batch"))
            .count();
        stall_as_stream += t
            .stall
            .iter()
            .filter(|e| marks.get(e).map(String::as_str) == Some("stream"))
            .count();
    }
    eprintln!(
        "batch hitches {batch_seen}/{batch_total} scope=batch; stream stalls {stall_as_batch}/{stall_total} scope=batch, {stall_as_stream} scope=stream"
    );
    // Every decoding stream sees (nearly) every long prompt's hold.
    assert!(
        batch_total >= STREAMS * LONG_PROMPTS * 9 / 10,
        "{batch_total}"
    );
    assert!(
        batch_seen * 100 >= batch_total * 95,
        "{batch_seen} of {batch_total} batch hitches counted batch"
    );
    assert_eq!(
        stall_total, STALLS,
        "each placed stall is a gap of its own stream alone"
    );
    assert!(
        stall_as_batch * 100 <= stall_total,
        "{stall_as_batch} of {stall_total} stream stalls counted batch"
    );
    assert_eq!(
        stall_as_stream, stall_total,
        "every stall is a hitch of its own stream"
    );
    assert!(m2.value("metronome_hitches_total", &[("scope", "batch")]) >= batch_seen as f64);

    // Each episode's arrivals name the long-prompt request that caused it.
    let long_ids: HashSet<String> = long.iter().map(|r| r.stream_id()).collect();
    let episodes = get_json(proxy.admin_addr, "/episodes").await;
    let episodes = episodes["episodes"].as_array().unwrap();
    assert_eq!(episodes.len() as f64, episodes_counted);
    let starts: Vec<u64> = episodes
        .iter()
        .map(|e| e["start_unix_ms"].as_u64().unwrap())
        .collect();
    assert!(starts.windows(2).all(|w| w[0] >= w[1]), "newest first");
    // Each episode counts its batch hitches by phase (all content here): over the episodes,
    // exactly the batch hitches the counter has.
    let m3 = scrape(&proxy).await;
    let by_phase = |phase: &str| -> u64 {
        let counted = episodes
            .iter()
            .map(|e| e["hitches_by_phase"][phase].as_u64().unwrap());
        counted.sum()
    };
    assert_eq!((by_phase("reasoning"), by_phase("tool_call")), (0, 0));
    assert_eq!(
        by_phase("content") as f64,
        m3.value("metronome_hitches_total", &[("scope", "batch")])
    );
    let mut named = Vec::new();
    for e in episodes.iter() {
        assert_eq!(e["upstream"], "default");
        assert!(
            e["streams"].as_u64().unwrap() >= (STREAMS / 2) as u64,
            "{e}"
        );
        // The lookback (2 s) may reach earlier long prompts too; the one that caused the
        // episode is the last to arrive before it, within a step and a bit.
        let arrived = e["arrived"].as_array().unwrap();
        let cause = arrived
            .iter()
            .min_by(|a, b| {
                let at = |v: &Value| v["before_start_ms"].as_f64().unwrap();
                at(a).total_cmp(&at(b))
            })
            .unwrap();
        let cause_id = cause["stream_id"].as_str().unwrap();
        if !long_ids.contains(cause_id) || cause["before_start_ms"].as_f64().unwrap() >= 100.0 {
            eprintln!("an episode no long prompt caused (the machine paused the sim): {e}");
            continue;
        }
        assert_eq!(cause["prompt_tokens"], HOLD * 10);
        assert!(cause["body_bytes"].as_u64().unwrap() > 0);
        named.push(cause_id.to_owned());
    }
    // Newest first: the long prompts in reverse order, each naming exactly one episode.
    let expected: Vec<String> = long.iter().rev().map(|r| r.stream_id()).collect();
    assert_eq!(named, expected, "every long prompt names its episode, once");

    // The episode histograms carry the episode's last arrival as their exemplar (OpenMetrics).
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::get(format!("http://{}/metrics", proxy.admin_addr))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let body = http_body_util::BodyExt::collect(client.request(req).await.unwrap().into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let exemplars: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("metronome_batch_episode_duration_seconds_bucket"))
        .filter_map(|l| l.split_once("# {stream_id=\"").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once('"').map(|(id, _)| id))
        .collect();
    assert!(!exemplars.is_empty(), "{text}");
    assert!(
        exemplars.iter().all(|id| long_ids.contains(*id)),
        "{exemplars:?}"
    );
}

/// An OpenAI chunk of `n` bytes of text, a frame of its own.
fn big_chunk(n: usize) -> bytes::Bytes {
    let text = "a".repeat(n);
    bytes::Bytes::from(format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}

/// Clients that read slowly give egress gaps only: the upstream's cadence at ingress stays
/// steady (the proxy reads ahead into its buffer), so no hitch and no episode is seen, though
/// both streams stall at egress at the same moment. Over HTTP/2 with a 64 KiB stream window, a
/// client that does not read holds the proxy's writes back (the reader task keeps reading).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_never_makes_an_episode() {
    let mut frames: Vec<bytes::Bytes> = (0..40).map(|_| big_chunk(8 * 1024)).collect();
    frames.push(bytes::Bytes::from_static(b"data: [DONE]\n\n"));
    // 50 ms apart: a hitch at ingress would need a gap of 200 ms, far beyond a loaded machine's
    // timer lateness.
    let upstream = Upstream::sse_frames(&frames, ms(50)).start().await;
    let proxy = proxy_to(upstream.addr).await;
    let addr = proxy.proxy_addr;
    let slow = futures_util::future::join_all((0..2).map(|_| async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .http2_adaptive_window(false)
                .http2_initial_stream_window_size(65_535)
                .http2_initial_connection_window_size(65_535)
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        let response = client.request(req).await.unwrap();
        let mut body = response.into_body();
        let mut bytes = 0;
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            let data = frame.unwrap().into_data().unwrap_or_default();
            if bytes == 0 {
                // Naps for 1 s after the first frame: the window (8 frames) fills in 400 ms, and
                // the next frame waits at egress for the rest: a stall, both streams at once.
                tokio::time::sleep(ms(1_000)).await;
            }
            bytes += data.len();
        }
        bytes
    }));
    let read = slow.await;
    assert!(read.iter().all(|n| *n > 40 * 8 * 1024), "{read:?}");
    let m = scrape_until(&proxy, |m| m.value("metronome_streams_total", &[]) == 2.0).await;
    tokio::time::sleep(ms(200)).await;
    let m2 = scrape(&proxy).await;
    assert!(
        m.value("metronome_stalls_total", &[("point", "egress")]) >= 2.0,
        "the slow readers stalled egress:\n{}",
        m.0.lines()
            .filter(|l| l.contains("stall") || l.contains("streams_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        m.value("metronome_stalls_total", &[("point", "ingress")]),
        0.0
    );
    assert_eq!(m2.value("metronome_batch_episodes_total", &[]), 0.0);
    assert_eq!(m2.value("metronome_hitches_total", &[]), 0.0);
    let episodes = get_json(proxy.admin_addr, "/episodes").await;
    assert_eq!(episodes["episodes"].as_array().unwrap().len(), 0);
}

/// `probe --join` against the proxy in front of the batch engine: the client's stalls are the
/// long prompt's hold, and the join gives them to generation (batch), not the streams' own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_join_gives_the_batchs_stalls_to_generation_batch() {
    use metronome::probe::{attribute_run_judged, measure, AdminUrl, Load, ProbeConfig, Stop};
    let sim = sim_with(SimConfig {
        tokens: 60,
        ..batch_engine(ms(GAP))
    })
    .await;
    let proxy = proxy_to(sim.addr()).await;
    let addr = proxy.proxy_addr;
    let mut config = ProbeConfig::new(&format!("http://{addr}"), "m").unwrap();
    config.stop = Stop::Requests(6);
    config.load = Load::Closed { concurrency: 6 };
    config.timeout = Duration::from_secs(20);
    let long = async {
        tokio::time::sleep(ms(500)).await;
        request(
            addr,
            "POST",
            "/v1/chat/completions",
            &chat_body(2, HOLD * 10, None),
            false,
        )
        .await
    };
    let (run, long) = tokio::join!(measure(&config), long);
    let run = run.unwrap();
    assert_eq!(long.status, 200);
    // The hitches settle a few sweeps after they end.
    scrape_until(&proxy, |m| {
        m.value("metronome_hitches_total", &[("scope", "batch")]) >= 6.0
    })
    .await;
    let admin = AdminUrl::parse(&format!("http://{}", proxy.admin_addr)).unwrap();
    let (a, _) = attribute_run_judged(&admin, &run, ms(200), false).await;
    eprintln!("{:?}", a.stalls);
    assert_eq!(a.streams_joined, 6);
    assert_eq!(a.stalls.stalls, 6, "one hold of 320 ms in each stream");
    assert_eq!(a.stalls.generation_batch, 6);
    assert_eq!(a.stalls.generation_stream, 0);
    let p99 = a.gap_ms.p99.unwrap();
    assert!(p99.generation_batch > 250.0, "{p99:?}");
    sim.shutdown().await.unwrap();
}
