//! The probe against a scripted streaming server on 127.0.0.1: cadence, stalls, clumps, errors,
//! open loop. Durations are asserted with generous margins, counts exactly.

mod support;

use std::time::Duration;

use metronome::probe::{
    measure, summarize, Load, ProbeConfig, ProbeRun, Report, Stop, StreamError,
};
use support::{ms, Upstream};

fn config(url: &str, requests: u64, concurrency: usize) -> ProbeConfig {
    let mut config = ProbeConfig::new(url, "m").unwrap();
    config.stop = Stop::Requests(requests);
    config.load = Load::Closed { concurrency };
    config.timeout = Duration::from_secs(10);
    config
}

async fn probe(config: &ProbeConfig) -> (ProbeRun, Report) {
    let run = measure(config).await.unwrap();
    let report = summarize(&run, config.stall_threshold);
    (run, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_30ms_cadence_is_measured_within_2ms() {
    let server = Upstream::sse().tokens(20).every(ms(30)).start().await;
    let (run, report) = probe(&config(&server.url(), 4, 2)).await;

    assert_eq!(report.requests, 4);
    assert_eq!(
        report.errors,
        0,
        "{:?}",
        run.streams.iter().map(|s| &s.error).collect::<Vec<_>>()
    );
    assert_eq!(report.detail.gaps, 4 * 19);
    assert_eq!(report.detail.token_events, 4 * 20);
    let p50 = report.itl_ms.p50.unwrap();
    eprintln!(
        "steady 30ms: itl {:?}, ttft {:?}",
        report.itl_ms, report.ttft_ms
    );
    assert!(
        (p50 - 30.0).abs() <= 2.0,
        "itl p50 {p50} ms is not within 2 ms of 30 ms"
    );
    // 19 gaps of 30 ms per stream: 33.3 tokens/s.
    let tps = report.tokens_per_second.p50.unwrap();
    assert!((25.0..40.0).contains(&tps), "tokens/s p50 {tps}");
    assert!(report.ttft_ms.p50.unwrap() >= 29.0);
    assert_eq!(report.stall_pct, Some(0.0));
    assert_eq!(report.reading_bands.from_15_to_50, Some(1.0));
    // The request is the default chat request.
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.bodies.len(), 4);
    let body: serde_json::Value = serde_json::from_slice(&seen.bodies[0]).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(body["model"], "m");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(seen.headers[0]["content-type"], "application/json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stall_among_39_gaps_per_stream() {
    let server = Upstream::sse()
        .tokens(40)
        .every(ms(20))
        .stall_before(21, ms(300))
        .start()
        .await;
    let (_, report) = probe(&config(&server.url(), 2, 2)).await;

    assert_eq!(report.errors, 0);
    assert_eq!(report.detail.gaps, 2 * 39);
    assert_eq!(report.detail.stalls, 2);
    let pct = report.stall_pct.unwrap();
    assert!((pct - 100.0 / 39.0).abs() < 1e-9, "stall_pct {pct}");
    // The stall gap is 20 + 300 ms; p99 of 78 gaps is rank 78: the longest.
    let max = report.itl_ms.max.unwrap();
    assert!((310.0..600.0).contains(&max), "itl max {max}");
    assert_eq!(report.itl_ms.p99, report.itl_ms.max);
    assert!(report.itl_ms.p95.unwrap() < 200.0);
    assert!(report.jank_ratio.unwrap() > 4.0);
    assert_eq!(report.verdict, metronome::probe::Verdict::Janky);
    assert_eq!(report.detail.streams_with_jank, 2);
    assert!(report.stream_jank_ratio.p50.unwrap() > 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_events_in_one_frame_have_a_gap_of_zero() {
    let server = Upstream::sse()
        .tokens(10)
        .per_frame(2)
        .every(ms(40))
        .start()
        .await;
    let (run, report) = probe(&config(&server.url(), 2, 1)).await;

    assert_eq!(report.errors, 0);
    assert_eq!(report.detail.gaps, 2 * 9);
    // Frames of two: the second event of each frame follows the first by 0.
    assert_eq!(report.detail.clumped_gaps, 2 * 5);
    let gaps: Vec<Duration> = run.streams[0].gaps().collect();
    assert_eq!(gaps.iter().filter(|g| g.is_zero()).count(), 5);
    assert_eq!(report.itl_ms.p50, Some(0.0));
    // Nearest rank on 18 gaps: p50 is rank 9, one of the ten zeros.
    assert!(report.itl_ms.max.unwrap() >= 30.0);
    // Jank floors the median at 1 ms.
    assert!(report.jank_ratio.unwrap() >= 30.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_total_is_preferred_over_counted_events() {
    let server = Upstream::sse()
        .tokens(10)
        .every(ms(10))
        .usage_tokens(19)
        .stream_id()
        .start()
        .await;
    let (run, report) = probe(&config(&server.url(), 2, 1)).await;

    assert_eq!(report.errors, 0);
    assert_eq!(report.detail.output_tokens, 2 * 19);
    for stream in &run.streams {
        assert_eq!(stream.counted_tokens, 10);
        assert_eq!(stream.usage_tokens, Some(19));
        assert_eq!(stream.output_tokens(), 19);
        // (19 − 1) tokens over 9 gaps of ~10 ms.
        let span = (*stream.token_times.last().unwrap() - stream.token_times[0]).as_secs_f64();
        let tps = stream.tokens_per_second().unwrap();
        assert!((tps - 18.0 / span).abs() < 1e-9);
        assert_eq!(stream.status, Some(200));
    }
    let mut ids: Vec<_> = run
        .streams
        .iter()
        .filter_map(|s| s.stream_id.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, ["s-0", "s-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_count_as_errors_and_do_not_stop_the_run() {
    let status = Upstream::sse().error_status(503).start().await;
    let (run, report) = probe(&config(&status.url(), 3, 2)).await;
    assert_eq!((report.requests, report.errors), (3, 3));
    assert!(run
        .streams
        .iter()
        .all(|s| s.error == Some(StreamError::Status(503))));
    assert_eq!(report.detail.errors_by_kind.get("status"), Some(&3));
    assert_eq!(report.itl_ms.p50, None);
    assert_eq!(report.stall_pct, None);

    let error_event = Upstream::sse()
        .tokens(10)
        .every(ms(5))
        .error_event_at(5)
        .start()
        .await;
    let (run, report) = probe(&config(&error_event.url(), 2, 1)).await;
    assert_eq!(report.errors, 2);
    assert!(run
        .streams
        .iter()
        .all(|s| s.error == Some(StreamError::ErrorEvent)));
    // The four token events before the error are still measured.
    assert_eq!(report.detail.token_events, 2 * 4);

    let no_tokens = Upstream::sse().tokens(0).start().await;
    let (run, report) = probe(&config(&no_tokens.url(), 2, 1)).await;
    assert_eq!(report.errors, 2);
    assert!(run
        .streams
        .iter()
        .all(|s| s.error == Some(StreamError::NoToken)));

    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        closed.local_addr().unwrap()
    );
    drop(closed);
    let (run, report) = probe(&config(&url, 3, 3)).await;
    assert_eq!((report.requests, report.errors), (3, 3));
    assert!(run
        .streams
        .iter()
        .all(|s| s.error.as_ref().map(StreamError::kind) == Some("connect")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_over_its_timeout_fails_but_keeps_its_gaps() {
    let server = Upstream::sse()
        .tokens(10)
        .every(ms(10))
        .stall_before(6, ms(5_000))
        .start()
        .await;
    let mut config = config(&server.url(), 1, 1);
    config.timeout = ms(400);
    let (run, report) = probe(&config).await;
    assert_eq!(report.errors, 1);
    assert_eq!(run.streams[0].error, Some(StreamError::Timeout(ms(400))));
    assert_eq!(report.detail.token_events, 5);
    assert_eq!(report.detail.gaps, 4);
    let elapsed = run.streams[0].finished.unwrap() - run.streams[0].sent.unwrap();
    assert!(elapsed >= ms(400) && elapsed < ms(3_000), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_measures_ttft_from_the_intended_start() {
    // Each stream takes about 30 + 5·30 = 180 ms; starts are due every 50 ms, one at a time.
    let server = Upstream::sse().tokens(6).every(ms(30)).start().await;
    let mut config = config(&server.url(), 5, 1);
    config.load = Load::Open {
        rate: 20.0,
        max_in_flight: Some(1),
    };
    let (run, report) = probe(&config).await;
    assert_eq!(report.errors, 0);
    for (i, stream) in run.streams.iter().enumerate() {
        // Intended starts are fixed: 50 ms apart from the run's start.
        let intended = stream.scheduled - run.started;
        assert!(intended.abs_diff(ms(50) * i as u32) < ms(1), "{intended:?}");
    }
    // Stream 4 was due at 200 ms but could only start after four streams of ~180 ms: its wait
    // for the single slot is part of its TTFT.
    let last = &run.streams[4];
    let held_back = last.sent.unwrap() - last.scheduled;
    assert!(held_back >= ms(400), "held back {held_back:?}");
    assert!(last.ttft().unwrap() >= held_back + ms(25));
    assert!(report.ttft_ms.max.unwrap() >= 425.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_without_a_cap_starts_on_time() {
    let server = Upstream::sse().tokens(6).every(ms(30)).start().await;
    let mut config = config(&server.url(), 4, 1);
    config.load = Load::Open {
        rate: 20.0,
        max_in_flight: None,
    };
    let (run, report) = probe(&config).await;
    assert_eq!((report.requests, report.errors), (4, 0));
    for stream in &run.streams {
        let late = stream.sent.unwrap() - stream.scheduled;
        assert!(late < ms(200), "stream {} sent {late:?} late", stream.index);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_stops_starting_streams_and_finishes_those_in_flight() {
    let server = Upstream::sse().tokens(5).every(ms(20)).start().await;
    let mut config = config(&server.url(), 0, 2);
    config.stop = Stop::After(ms(250));
    let (run, report) = probe(&config).await;
    assert_eq!(report.errors, 0);
    // Streams take ~100 ms, two at a time, for 250 ms: a handful, each complete.
    assert!(
        (2..=8).contains(&run.streams.len()),
        "{}",
        run.streams.len()
    );
    assert!(run.streams.iter().all(|s| s.token_times.len() == 5));
    assert!(run
        .streams
        .iter()
        .all(|s| s.scheduled - run.started < ms(250)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_body_and_headers_are_sent_unchanged() {
    let server = Upstream::sse().tokens(3).every(ms(5)).start().await;
    let mut config = config(&server.url(), 1, 1);
    config.body = bytes::Bytes::from_static(b"{\"model\":\"x\",\"stream\":true,\"prompt\":\"hi\"}");
    config
        .headers
        .insert("authorization", "Bearer secret".parse().unwrap());
    let (_, report) = probe(&config).await;
    assert_eq!(report.errors, 0);
    let seen = server.seen.lock().unwrap();
    assert_eq!(&seen.bodies[0][..], &config.body[..]);
    assert_eq!(seen.headers[0]["authorization"], "Bearer secret");
}

// The probe against the real `metronome sim`.

mod against_the_sim {
    use super::*;
    use metronome::probe::args::chat_body;
    use metronome::sim::{self, SimConfig, SimHandle};

    async fn start(config: SimConfig) -> SimHandle {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        sim::spawn(listener, config).unwrap()
    }

    fn probe_config(sim: &SimHandle, streams: u64, concurrency: usize, tokens: u32) -> ProbeConfig {
        let mut config = config(&sim.url(), streams, concurrency);
        config.body = chat_body("sim-model", "Say something steady.", tokens);
        config
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn steady_30ms_cadence_is_measured_within_2ms() {
        let sim = start(SimConfig {
            gap: ms(30),
            ttft: ms(50),
            ..SimConfig::default()
        })
        .await;
        let (run, report) = probe(&probe_config(&sim, 4, 2, 40)).await;
        eprintln!("sim steady 30ms: itl {:?}", report.itl_ms);

        assert_eq!((report.requests, report.errors), (4, 0));
        assert_eq!(report.detail.gaps, 4 * 39);
        assert!(run.streams.iter().all(|s| s.usage_tokens == Some(40)));
        let p50 = report.itl_ms.p50.unwrap();
        assert!(
            (p50 - 30.0).abs() <= 2.0,
            "itl p50 {p50} ms is not within 2 ms of 30 ms"
        );
        assert!(report.ttft_ms.p50.unwrap() >= 49.0);
        assert_eq!(report.stall_pct, Some(0.0));
        sim.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http2_streams_are_measured_alike() {
        let sim = start(SimConfig {
            gap: ms(5),
            ttft: ms(5),
            ..SimConfig::default()
        })
        .await;
        let mut config = probe_config(&sim, 6, 6, 10);
        config.http2 = true;
        let (run, report) = probe(&config).await;
        assert_eq!((report.requests, report.errors), (6, 0));
        assert_eq!(report.detail.gaps, 6 * 9);
        assert!(run.streams.iter().all(|s| s.usage_tokens == Some(10)));
        sim.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_placed_stall_is_one_of_39_gaps() {
        let sim = start(SimConfig {
            gap: ms(20),
            ttft: ms(20),
            stall_at: vec![20],
            stall: ms(300),
            ..SimConfig::default()
        })
        .await;
        let (_, report) = probe(&probe_config(&sim, 3, 3, 40)).await;

        assert_eq!(report.errors, 0);
        assert_eq!(report.detail.gaps, 3 * 39);
        assert_eq!(report.detail.stalls, 3);
        let pct = report.stall_pct.unwrap();
        assert!((pct - 100.0 / 39.0).abs() < 1e-9, "stall_pct {pct}");
        let max = report.itl_ms.max.unwrap();
        assert!((310.0..600.0).contains(&max), "itl max {max}");
        // 117 gaps: p99 is rank 116, among the three stalls.
        assert!(report.itl_ms.p99.unwrap() >= 310.0);
        assert!(report.itl_ms.p95.unwrap() < 200.0);
        sim.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn coalesced_frames_show_as_zero_gaps() {
        let sim = start(SimConfig {
            gap: ms(15),
            ttft: ms(10),
            coalesce: 2,
            ..SimConfig::default()
        })
        .await;
        let (_, report) = probe(&probe_config(&sim, 2, 1, 20)).await;

        assert_eq!(report.errors, 0);
        assert_eq!(report.detail.gaps, 2 * 19);
        // 20 token events in frames of two: 10 gaps of 0 per stream.
        assert_eq!(report.detail.clumped_gaps, 2 * 10);
        assert_eq!(report.itl_ms.p50, Some(0.0));
        sim.shutdown().await.unwrap();
    }
}

// The probe through the metering proxy: the client's view and the stream ID to join it with.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxy_the_stream_id_is_kept() {
    use metronome::config::Config;
    use metronome::proxy::ProxyHandle;

    let upstream = Upstream::sse()
        .tokens(20)
        .every(ms(20))
        .stall_before(11, ms(300))
        .start()
        .await;
    let proxy_config = Config::from_toml(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nupstream = \"http://{}\"\n\
         [[routes]]\nname = \"chat\"\npath = \"/v1/chat/completions\"\nmatch = \"exact\"\n",
        upstream.addr
    ))
    .unwrap();
    let proxy = ProxyHandle::start(proxy_config).await.unwrap();
    let url = format!("http://{}", proxy.proxy_addr);
    let (run, report) = probe(&config(&url, 3, 3)).await;

    assert_eq!((report.requests, report.errors), (3, 0));
    assert_eq!(report.detail.gaps, 3 * 19);
    assert_eq!(report.detail.stalls, 3);
    let mut ids: Vec<_> = run.streams.iter().map(|s| s.stream_id.clone()).collect();
    assert!(ids.iter().all(Option::is_some), "{ids:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "stream IDs are distinct: {ids:?}");
    proxy.shutdown().await;
}
