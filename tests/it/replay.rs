//! `metronome sim --replay`: a captured `/streams/{id}` timeline played back with its cadence and
//! framing, measured by the probe and by metronome itself. Counts exact, times within margins.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use metronome::probe::{measure, Load, ProbeConfig, Stop};
use metronome::sim::replay::Replay;
use metronome::sim::SimConfig;
use metronome::timeline_json::StreamTimeline;
use tokio::net::TcpListener;

/// A captured `/streams/{id}` (the contract JSON): a role frame, tokens every 30 ms, a 300 ms stall,
/// an event split across two frames, frames of two token events, and the trailer.
const FIXTURE: &str = "tests/replay/timeline-stall.json";

/// How far a replayed frame may land from its captured offset (timers, scheduling, 2 shared cores;
/// the fixture's frames are 10 to 300 ms apart, so this still pins each one down).
const MARGIN_MS: f64 = 40.0;

fn fixture() -> StreamTimeline {
    serde_json::from_slice(&std::fs::read(FIXTURE).unwrap()).unwrap()
}

async fn replaying_sim() -> metronome::sim::SimHandle {
    let replay = Replay::load(Path::new(FIXTURE), "sim-model").unwrap();
    let config = SimConfig {
        replay: Some(Arc::new(replay)),
        ..SimConfig::default()
    };
    metronome::sim::spawn(TcpListener::bind("127.0.0.1:0").await.unwrap(), config).unwrap()
}

fn ms_between(a: std::time::Instant, b: std::time::Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1e3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_sees_the_captured_frames_events_and_cadence() {
    let captured = fixture();
    let sim = replaying_sim().await;
    let mut config = ProbeConfig::new(&sim.url(), "sim-model").unwrap();
    config.stop = Stop::Requests(2);
    config.load = Load::Closed { concurrency: 2 };
    config.timeout = Duration::from_secs(10);
    let run = measure(&config).await.unwrap();

    for stream in &run.streams {
        assert_eq!(stream.error, None);
        // Every captured frame is at least 10 ms from the next, so each is one read.
        assert_eq!(stream.frames, captured.frames.len() as u64);
        let counts: Vec<(u32, u32)> = stream
            .reads
            .iter()
            .map(|r| (r.events, r.token_events))
            .collect();
        let want: Vec<(u32, u32)> = captured
            .frames
            .iter()
            .map(|f| (f.events, f.token_events))
            .collect();
        assert_eq!(counts, want);
        assert_eq!(stream.token_times.len(), 17);
        assert_eq!(stream.usage_tokens, Some(17));
        // The first frame at 80 ms after the request; every later one at its captured offset
        // from the first.
        let sent = stream.sent.unwrap();
        let first = stream.reads[0].at;
        let ttfb = ms_between(sent, first);
        assert!((80.0..80.0 + 2.0 * MARGIN_MS).contains(&ttfb), "{ttfb}");
        for (read, frame) in stream.reads.iter().zip(&captured.frames) {
            let got = ms_between(first, read.at);
            let want = (frame.ingress_us - captured.frames[0].ingress_us) as f64 / 1e3;
            assert!(
                (got - want).abs() <= MARGIN_MS,
                "frame at {want} ms arrived at {got} ms"
            );
        }
        // The 300 ms stall is there.
        let gaps: Vec<Duration> = stream.gaps().collect();
        assert!(gaps[9] >= Duration::from_millis(300), "{gaps:?}");
    }
    assert_eq!(sim.stats().completed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metronome_captures_the_replay_as_the_original() {
    // Capture -> replay -> capture: the second capture has the first one's framing and cadence.
    let captured = fixture();
    let sim = replaying_sim().await;
    let proxy = support::proxy_with(sim.addr(), |config| config.timeline.frame_sizes = true).await;
    let got = support::stream_chat(proxy.proxy_addr).await;
    let id = got.stream_id();
    let mut recaptured = None;
    for _ in 0..50 {
        let answer = support::request(
            proxy.admin_addr,
            "GET",
            &format!("/streams/{id}"),
            "",
            false,
        )
        .await;
        if answer.status == 200 {
            recaptured = Some(serde_json::from_slice::<StreamTimeline>(&answer.bytes()).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recaptured = recaptured.expect("the replayed stream's timeline");
    assert_eq!(recaptured.frames.len(), captured.frames.len());
    assert_eq!(recaptured.frames_dropped, 0);
    let t0 = (
        recaptured.frames[0].ingress_us,
        captured.frames[0].ingress_us,
    );
    for (again, original) in recaptured.frames.iter().zip(&captured.frames) {
        assert_eq!(
            (again.events, again.token_events),
            (original.events, original.token_events)
        );
        assert!(
            again.bytes.unwrap().abs_diff(original.bytes.unwrap()) <= 2,
            "{again:?} vs {original:?}"
        );
        let offset = |f: u64, base: u64| (f - base) as f64 / 1e3;
        let (a, o) = (
            offset(again.ingress_us, t0.0),
            offset(original.ingress_us, t0.1),
        );
        assert!((a - o).abs() <= MARGIN_MS, "{a} ms vs {o} ms");
    }
}

#[test]
fn a_bad_timeline_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"id\": \"x\", \"frames\": []}").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["sim", "--listen", "127.0.0.1:0", "--replay"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--replay") && stderr.contains("no frames"),
        "{stderr}"
    );
}
