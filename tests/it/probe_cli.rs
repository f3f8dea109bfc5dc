//! `metronome probe` as CI runs it: the built binary against a scripted upstream, checking the
//! exit codes (0 pass, 1 gate failed, 2 usage error, 3 the run failed), the gate lines and the
//! report files.

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use support::{ms, RunningUpstream, Upstream};

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metronome"))
        .arg("probe")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Probes `server` with two requests and `report_args` (the report files to write), and checks
/// that the run exits 0: the report tests read those files afterwards.
fn probe_two_requests_writing(server: &RunningUpstream, report_args: &[&str]) {
    let url = server.url();
    let output = probe(&[&["--url", url.as_str(), "-n", "2"][..], report_args].concat());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// A report file the probe wrote, parsed.
fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A steady 20 ms upstream with one 300 ms stall per stream (19 gaps per stream).
fn upstream() -> RunningUpstream {
    Upstream::sse()
        .tokens(20)
        .every(ms(20))
        .stall_before(11, ms(300))
        .start_in_background()
}

/// Every gate, with a bound the scripted upstream passes.
const PASSING: &str = "tps_p50>5,tps_p5>2,itl_p50<150ms,itl_p95<5s,itl_p99<5s,itl_max<5s,\
ttft_p50<3s,ttft_p95<3s,ttft_p99<3s,ttft_max<3s,jank<1000,stream_jank_p50<1000,\
stream_jank_p95<1000,stall_pct>1,stall_pct<50,stalled_streams_pct==100,errors<1,errors==0";

/// Every gate, with a bound the scripted upstream fails.
const FAILING: [&str; 16] = [
    "tps_p50>10000",
    "tps_p5>10000",
    "itl_p50<1us",
    "itl_p95<1us",
    "itl_p99<250ms",
    "itl_max<250ms",
    "ttft_p50<1us",
    "ttft_p95<1us",
    "ttft_p99<1us",
    "ttft_max<1us",
    "jank<1",
    "stream_jank_p50<1",
    "stream_jank_p95<1",
    "stall_pct<1",
    "stalled_streams_pct<50",
    "errors>=1",
];

#[test]
fn every_gate_passes_and_fails_with_the_right_exit_code() {
    let server = upstream();
    let url = server.url();

    let pass = probe(&["--url", &url, "-n", "2", "-c", "2", "--assert", PASSING]);
    let text = stdout(&pass);
    assert_eq!(pass.status.code(), Some(0), "{text}{}", stderr(&pass));
    assert_eq!(text.matches("\nPASS ").count(), 18, "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    // Every stream stalled once: JANKY, and with every gate passed that is the headline.
    assert!(
        text.contains("verdict        JANKY   (100.0% of streams stalled (SMOOTH allows 1%)"),
        "{text}"
    );
    assert!(
        text.ends_with("result         JANKY   (every gate passed (18))\n"),
        "{text}"
    );

    let mut args = vec!["--url", url.as_str(), "-n", "2", "-c", "2"];
    for gate in FAILING {
        args.extend(["--assert", gate]);
    }
    let fail = probe(&args);
    let text = stdout(&fail);
    assert_eq!(fail.status.code(), Some(1), "{text}{}", stderr(&fail));
    for gate in FAILING {
        assert!(
            text.contains(&format!("FAIL {gate}: measured ")),
            "{gate}: {text}"
        );
    }
    // The stall makes the longest gap about 320 ms.
    let line = text
        .lines()
        .find(|l| l.starts_with("FAIL itl_max<250ms"))
        .unwrap();
    assert!(line.contains("ms"), "{line}");
    assert!(text.contains("FAIL stall_pct<1: measured 5.26"), "{text}");
    assert!(text.contains("FAIL errors>=1: measured 0"), "{text}");
    assert!(
        text.contains("FAIL stalled_streams_pct<50: measured 100.00"),
        "{text}"
    );
    assert!(
        text.contains("result         FAIL   (16 of 16 gates failed: tps_p50>10000, "),
        "{text}"
    );

    // One failing gate among passing ones is enough.
    let mixed = probe(&[
        "--url",
        &url,
        "-n",
        "1",
        "--assert",
        "errors<1",
        "--assert",
        "itl_max<250ms",
    ]);
    let text = stdout(&mixed);
    assert_eq!(mixed.status.code(), Some(1), "{text}");
    assert!(text.contains("PASS errors<1: measured 0"), "{text}");
    assert!(text.contains("FAIL itl_max<250ms: measured "), "{text}");
}

/// A URL on a port nothing listens on.
fn refused_url() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        closed.local_addr().unwrap()
    );
    drop(closed);
    url
}

#[test]
fn a_refused_port_is_a_failed_run_exit_3() {
    let url = refused_url();
    // Without --model, the model list cannot be read: exit 3, saying what to do.
    let no_model = probe(&["--url", &url, "-n", "3"]);
    assert_eq!(no_model.status.code(), Some(3), "{}", stderr(&no_model));
    let err = stderr(&no_model);
    assert!(
        err.contains("no --model given, and none could be found"),
        "{err}"
    );
    assert!(err.contains("/v1/models failed"), "{err}");
    assert!(err.contains("--model NAME"), "{err}");

    // With a model, every stream fails to connect: exit 3 with or without gates.
    let plain = probe(&["--url", &url, "-n", "3", "--model", "m"]);
    assert_eq!(plain.status.code(), Some(3), "{}", stderr(&plain));
    assert!(
        stdout(&plain).contains("3 failed (connect 3)"),
        "{}",
        stdout(&plain)
    );
    let err = stderr(&plain);
    assert!(
        err.contains("the run failed: no stream completed (3 of 3 failed)"),
        "{err}"
    );
    assert!(err.contains("  connect (3): could not connect: "), "{err}");

    let gated = probe(&[
        "--url", &url, "-n", "3", "--model", "m", "--assert", "errors<1",
    ]);
    assert_eq!(gated.status.code(), Some(3));
    assert!(
        stdout(&gated).contains("FAIL errors<1: measured 3"),
        "{}",
        stdout(&gated)
    );
}

#[test]
fn a_404_server_is_a_failed_run_showing_its_error_body() {
    let server = Upstream::sse()
        .error_status(404)
        .no_models()
        .start_in_background();
    let url = server.url();
    let no_model = probe(&["--url", &url, "-n", "2"]);
    assert_eq!(no_model.status.code(), Some(3), "{}", stderr(&no_model));
    assert!(
        stderr(&no_model).contains("/v1/models answered 404: {\"detail\":\"Not Found\"}"),
        "{}",
        stderr(&no_model)
    );
    let output = probe(&[
        "--url",
        &url,
        "-n",
        "2",
        "--model",
        "nope",
        "-H",
        "Authorization: Bearer secret-token",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let (out, err) = (stdout(&output), stderr(&output));
    assert!(out.contains("2 failed (status 2)"), "{out}");
    let example =
        "the server answered with status 404: {\"error\":{\"message\":\"scripted failure\"}}";
    assert!(out.contains(example), "{out}");
    assert!(err.contains(&format!("  status (2): {example}")), "{err}");
    assert!(!out.contains("secret-token") && !err.contains("secret-token"));
}

#[test]
fn a_server_failing_half_the_requests_fails_the_run_over_the_error_rate() {
    let server = Upstream::sse()
        .tokens(3)
        .every(ms(5))
        .fail_every(2)
        .start_in_background();
    let url = server.url();
    let output = probe(&["--url", &url, "-n", "4", "--assert", "errors<10"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("no --model given; using `scripted-model`"),
        "{err}"
    );
    assert!(
        err.contains(
            "the run failed: 2 of 4 streams failed (50.0%, more than --max-error-rate 0.05)"
        ),
        "{err}"
    );
    assert!(stdout(&output).contains("PASS errors<10: measured 2"));
    // Allowing half of them to fail makes it a run again, and the gates decide.
    let allowed = probe(&[
        "--url",
        &url,
        "-n",
        "4",
        "--max-error-rate",
        "0.5",
        "--assert",
        "errors<10",
    ]);
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    let gated = probe(&[
        "--url",
        &url,
        "-n",
        "4",
        "--max-error-rate",
        "0.5",
        "--assert",
        "errors<1",
    ]);
    assert_eq!(gated.status.code(), Some(1), "{}", stderr(&gated));
    let bad = probe(&["--url", &url, "--max-error-rate", "2"]);
    assert_eq!(bad.status.code(), Some(2));
    // The model the probe found is the one it asked for.
    let seen = server.seen.lock().unwrap();
    let body: serde_json::Value = serde_json::from_slice(&seen.bodies[0]).unwrap();
    assert_eq!(body["model"], "scripted-model");
}

#[test]
fn a_latency_gate_without_data_fails() {
    let server = Upstream::sse().tokens(0).start_in_background();
    let url = server.url();
    // No token event at all: no stream completed (exit 3), and the gate fails rather than
    // passing vacuously.
    let no_data = probe(&["--url", &url, "-n", "1", "--assert", "itl_p99<250ms"]);
    assert_eq!(no_data.status.code(), Some(3));
    assert!(stdout(&no_data).contains("FAIL itl_p99<250ms: measured no data"));
}

#[test]
fn usage_errors_exit_2_before_any_request() {
    // Nothing listens here; a usage error must be reported before connecting.
    let url = "http://127.0.0.1:9/v1/chat/completions";
    let cases: [(&[&str], &str); 11] = [
        (&["--assert", "itl_p99"], "has no comparison"),
        (&["--assert", "itl_p98<250ms"], "not a metric"),
        (&["--assert", "itl_p99<250"], "needs a duration with a unit"),
        (&["--assert", "tps_p50>fast"], "needs a plain number"),
        (
            &["--body", "/nonexistent/metronome-body.json"],
            "cannot read the request body",
        ),
        (&["--header", "no-colon"], "is not a header"),
        (&["--concurrency", "0"], "must be at least 1"),
        (&["--no-such-flag"], "unexpected argument"),
        (&["--assert", "itl_p99<1.1*baseline"], "give --baseline"),
        (&["--slo", "ttft<500"], "needs a duration"),
        (
            &["--baseline", "/nonexistent/main.json"],
            "cannot read the report",
        ),
    ];
    for (extra, message) in cases {
        let mut args = vec!["--url", url];
        args.extend_from_slice(extra);
        let output = probe(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{extra:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(message),
            "{extra:?}: {}",
            stderr(&output)
        );
        assert!(stdout(&output).is_empty(), "{extra:?}: {}", stdout(&output));
    }
    let ftp = probe(&["--url", "ftp://127.0.0.1:9/"]);
    assert_eq!(ftp.status.code(), Some(2));
    assert!(stderr(&ftp).contains("http:// and https://"));
    let no_ca = probe(&[
        "--url",
        "https://127.0.0.1:9/",
        "--cacert",
        "/nonexistent/ca.pem",
    ]);
    assert_eq!(no_ca.status.code(), Some(2));
    assert!(
        stderr(&no_ca).contains("/nonexistent/ca.pem"),
        "{}",
        stderr(&no_ca)
    );
    let both = probe(&["--url", url, "--requests", "5", "--duration", "1s"]);
    assert_eq!(both.status.code(), Some(2));
    let unitless = probe(&["--url", url, "--timeout", "5"]);
    assert_eq!(unitless.status.code(), Some(2));
}

#[test]
fn json_report_has_exactly_the_contract_keys() {
    let server = upstream();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    let html_path = dir.path().join("report.html");
    probe_two_requests_writing(
        &server,
        &[
            "--json",
            json_path.to_str().unwrap(),
            "--html",
            html_path.to_str().unwrap(),
        ],
    );

    let report = read_json(&json_path);
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    };
    let expected =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| s.to_string()).collect() };
    assert_eq!(
        keys(&report),
        expected(&[
            "requests",
            "errors",
            "ttft_ms",
            "ttfo_ms",
            "itl_ms",
            "phases",
            "tokens_per_second",
            "stall_pct",
            "stalled_streams_pct",
            "jank_ratio",
            "stream_jank_ratio",
            "verdict",
            "reading_bands",
            "throughput",
            "meta",
            "gates",
            "result",
        ])
    );
    assert_eq!(
        keys(&report["meta"]),
        expected(&[
            "version",
            "command_line",
            "url",
            "model",
            "load",
            "concurrency",
            "rate",
            "started",
            "duration_s",
            "workload"
        ])
    );
    assert_eq!(
        keys(&report["meta"]["workload"]),
        expected(&[
            "requests",
            "duration_s",
            "max_tokens",
            "ignore_eos",
            "input_tokens",
            "dataset",
            "body",
            "dataset_requests",
            "seed",
            "http2",
            "stall_threshold_ms"
        ])
    );
    assert_eq!(report["meta"]["workload"]["requests"], 2);
    assert_eq!(report["meta"]["workload"]["max_tokens"], 64);
    assert_eq!(report["meta"]["workload"]["stall_threshold_ms"], 200.0);
    // No gate: the headline is the verdict, and the result says so.
    assert_eq!(report["gates"], serde_json::json!([]));
    assert_eq!(report["result"]["headline"], report["verdict"]);
    assert_eq!(report["result"]["exit_code"], 0);
    assert_eq!(report["result"]["summary"], "no gate was given");
    assert!(report["result"]["failure"].is_null());
    assert_eq!(report["meta"]["model"], "scripted-model");
    assert_eq!(report["meta"]["load"], "closed");
    assert_eq!(report["meta"]["concurrency"], 1);
    assert_eq!(report["meta"]["url"], server.url());
    assert_eq!(report["meta"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(report["meta"]["started"].as_str().unwrap().ends_with('Z'));
    let wall = report["meta"]["duration_s"].as_f64().unwrap();
    // Two streams of 20 token events 20 ms apart, one after the other, plus a 300 ms stall each.
    assert!(wall > 1.0 && wall < 30.0, "{wall}");
    let rps = report["throughput"]["requests_per_second"]
        .as_f64()
        .unwrap();
    assert!((rps - 2.0 / wall).abs() < 0.05 * rps, "{rps} {wall}");
    let tps = report["throughput"]["output_tokens_per_second"]
        .as_f64()
        .unwrap();
    assert!((tps - 40.0 / wall).abs() < 0.05 * tps, "{tps} {wall}");
    let quantiles = expected(&["p50", "p95", "p99", "max"]);
    assert_eq!(keys(&report["ttft_ms"]), quantiles);
    assert_eq!(keys(&report["itl_ms"]), quantiles);
    assert_eq!(keys(&report["tokens_per_second"]), expected(&["p50", "p5"]));
    assert_eq!(
        keys(&report["stream_jank_ratio"]),
        expected(&["p50", "p95"])
    );
    assert_eq!(
        keys(&report["reading_bands"]),
        expected(&["below_5", "5_to_7", "7_to_15", "15_to_50", "above_50"])
    );
    assert_eq!(report["requests"], 2);
    assert_eq!(report["errors"], 0);
    assert_eq!(report["verdict"], "JANKY");
    // 1 stall among 19 gaps per stream.
    let stall_pct = report["stall_pct"].as_f64().unwrap();
    assert!((stall_pct - 100.0 / 19.0).abs() < 1e-9, "{stall_pct}");
    let bands: f64 = report["reading_bands"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!((bands - 1.0).abs() < 1e-9);

    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("JANKY"));
    assert_eq!(html.matches("<g><title>stream").count(), 2);
    assert!(!html.contains("<script"));
}

#[test]
fn detail_file_has_the_tail_in_microseconds() {
    let server = upstream();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("detail.json");
    probe_two_requests_writing(&server, &["--detail", path.to_str().unwrap()]);
    let detail = read_json(&path);
    assert_eq!(detail["requests"], 2);
    assert_eq!(detail["errors"], 0);
    assert_eq!(detail["token_events"], 2 * 20);
    assert_eq!(detail["gaps"], 2 * 19);
    for key in ["p50", "p99", "p999", "max"] {
        assert!(detail["itl_us"][key].is_f64(), "{key}: {detail}");
        assert!(detail["ttft_us"][key].is_f64(), "{key}: {detail}");
    }
    // 38 gaps, 2 of them the 300 ms stall: p99.9 and max are a stall, p50 is a 20 ms gap.
    let us = |key: &str| detail["itl_us"][key].as_f64().unwrap();
    assert!(
        us("p999") >= 300_000.0 && us("p999") == us("max"),
        "{detail}"
    );
    // A gap can read a little under 20 ms when the frame before it was late: a generous margin.
    assert!(us("p50") >= 10_000.0 && us("p50") < 200_000.0, "{detail}");
}

#[test]
fn no_data_is_null_in_json() {
    let server = Upstream::sse().error_status(500).start_in_background();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("report.json");
    // The report is written even when the run failed (exit 3).
    let url = server.url();
    let output = probe(&[
        "--url",
        &url,
        "-n",
        "2",
        "--json",
        json_path.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let report = read_json(&json_path);
    assert_eq!(report["errors"], 2);
    assert!(report["itl_ms"]["p50"].is_null());
    assert!(report["ttft_ms"]["max"].is_null());
    assert!(report["tokens_per_second"]["p5"].is_null());
    assert!(report["stall_pct"].is_null());
    assert!(report["jank_ratio"].is_null());
    assert!(report["reading_bands"]["above_50"].is_null());
    assert_eq!(report["verdict"], "JANKY");
}

/// Starts `metronome sim` on a runtime of its own thread; returns its base URL.
fn sim_in_background(config: metronome::sim::SimConfig) -> String {
    support::in_background(|started| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = metronome::sim::spawn(listener, config).unwrap();
        started.send(sim.url()).unwrap();
        std::future::pending::<()>().await;
    })
}

#[test]
fn the_ci_gate_against_the_sim() {
    use metronome::sim::SimConfig;
    let steady = sim_in_background(SimConfig {
        gap: ms(20),
        ttft: ms(20),
        ..SimConfig::default()
    });
    let stalling = sim_in_background(SimConfig {
        gap: ms(20),
        ttft: ms(20),
        stall_at: vec![20],
        stall: ms(300),
        ..SimConfig::default()
    });
    let gate = "itl_p99<250ms,tps_p50>10,errors<1";
    let common = ["-n", "3", "-c", "3", "--max-tokens", "40", "--assert", gate];

    let pass = probe(&[&["--url", steady.as_str()][..], &common].concat());
    let text = stdout(&pass);
    assert_eq!(pass.status.code(), Some(0), "{text}{}", stderr(&pass));
    assert!(text.contains("PASS itl_p99<250ms: measured "), "{text}");
    assert!(text.contains("(117 gaps, 0 inside one frame)"), "{text}");

    let fail = probe(&[&["--url", stalling.as_str()][..], &common].concat());
    let text = stdout(&fail);
    assert_eq!(fail.status.code(), Some(1), "{text}{}", stderr(&fail));
    // 3 stalls among 117 gaps: p99 (rank 116) is a stall of 20 + 300 ms.
    let line = text
        .lines()
        .find(|l| l.starts_with("FAIL itl_p99<250ms"))
        .unwrap();
    assert!(line.contains("measured 3"), "{line}");
    assert!(
        text.contains(
            "stalls         2.56%   (3 of 117 gaps over 200.0ms; 3 of 3 streams stalled)"
        ),
        "{text}"
    );
    assert!(text.contains("PASS errors<1: measured 0"), "{text}");
}
