//! `metronome probe` as a CI job runs it: progress off a terminal, goodput and its gate,
//! baselines and `probe compare`, the JUnit and Markdown reports, the workload's shape and the
//! rate sweep. The built binary against the scripted upstream of tests/support/upstream.rs.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{ms, RunningUpstream, Upstream};

fn probe(args: &[&str]) -> Output {
    probe_with_env(args, &[])
}

fn probe_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::run_probe(args, env)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// 10 token events 20 ms apart, the first after 30 ms: about 210 ms a stream.
fn steady() -> RunningUpstream {
    Upstream::sse()
        .tokens(10)
        .every(ms(20))
        .start_in_background()
}

#[test]
fn progress_lines_off_a_terminal() {
    let server = steady();
    let url = server.url();
    let output = probe(&[
        "--url",
        &url,
        "--duration",
        "3s",
        "-c",
        "2",
        "--progress-interval",
        "1s",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("progress ")).collect();
    assert!(lines.len() >= 2, "{err}");
    for line in &lines {
        assert!(
            line.contains(" done, ") && line.contains(" in flight, "),
            "{line}"
        );
        assert!(
            line.contains(" failed, ") && line.contains(" token events, ITL p50 "),
            "{line}"
        );
    }
    // 0 turns them off.
    let quiet = probe(&[
        "--url",
        &url,
        "--duration",
        "1500ms",
        "--progress-interval",
        "0s",
    ]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(!stderr(&quiet).contains("progress "), "{}", stderr(&quiet));
}

#[test]
fn progress_counts_the_streams_in_flight_before_any_ends() {
    // 4 streams of about 3 s, all at once: the first line, a second in, has none done and all
    // four in flight.
    let server = Upstream::sse()
        .tokens(10)
        .every(ms(300))
        .start_in_background();
    let output = probe(&[
        "--url",
        &server.url(),
        "-n",
        "4",
        "-c",
        "4",
        "--progress-interval",
        "1s",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    let first = err.lines().find(|l| l.starts_with("progress ")).unwrap();
    assert!(
        first.contains(": 0 done, 4 in flight, 0 failed, "),
        "{first}"
    );
}

#[test]
fn goodput_and_its_gate() {
    // Every stream: TTFT about 30 ms, e2el about 210 ms, tpot about 20 ms.
    let server = steady();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let pass = probe(&[
        "--url",
        &url,
        "-n",
        "4",
        "-c",
        "2",
        "--slo",
        "ttft<2s,tpot<=1s,itl_p99<1s,stalls==0",
        "--assert",
        "goodput>=0.99,goodput_rps>0",
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = stdout(&pass);
    assert_eq!(pass.status.code(), Some(0), "{text}{}", stderr(&pass));
    assert!(
        text.contains(
            "goodput        100%   (4 of 4 streams met ttft<2s,tpot<=1s,itl_p99<1s,stalls==0;"
        ),
        "{text}"
    );
    assert!(text.contains("PASS goodput>=0.99: measured 1.00"), "{text}");
    let report = read_json(&json);
    assert_eq!(report["goodput"]["good"], 4);
    assert_eq!(report["goodput"]["streams"], 4);
    assert_eq!(report["goodput"]["share"], 1.0);
    assert_eq!(report["goodput"]["objectives"][3]["objective"], "stalls==0");

    // A TTFT objective no stream can meet.
    let fail = probe(&[
        "--url",
        &url,
        "-n",
        "2",
        "--slo",
        "ttft<1us,tpot<1s",
        "--assert",
        "goodput>=0.99",
    ]);
    let text = stdout(&fail);
    assert_eq!(fail.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL goodput>=0.99: measured 0.00"), "{text}");
    assert!(
        text.contains("met per objective: ttft<1us 0, tpot<1s 2"),
        "{text}"
    );
    // Without --slo there is no goodput, and its gate fails.
    let none = probe(&["--url", &url, "-n", "1", "--assert", "goodput>=0.5"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stdout(&none).contains("FAIL goodput>=0.5: measured no data"));
}

#[test]
fn baselines_pass_and_fail_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("main.json");
    let slow = dir.path().join("slow.json");
    // The baseline: 20 ms gaps.
    let server = steady();
    let out = probe(&[
        "--url",
        &server.url(),
        "-n",
        "2",
        "--json",
        base.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // The same server again: within 1.5x of the baseline's gaps and above half its speed.
    let gates = "itl_p50<1.5*baseline,tps_p50>0.5*baseline";
    let pass = probe(&[
        "--url",
        &server.url(),
        "-n",
        "2",
        "--baseline",
        base.to_str().unwrap(),
        "--assert",
        gates,
    ]);
    let text = stdout(&pass);
    assert_eq!(pass.status.code(), Some(0), "{text}{}", stderr(&pass));
    assert!(text.contains("against the baseline main.json:"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("itl_p50 ")), "{text}");
    assert!(
        text.contains("PASS itl_p50<1.5*baseline: measured "),
        "{text}"
    );
    assert!(text.contains("(baseline "), "{text}");

    // A server four times slower fails both.
    let slower = Upstream::sse()
        .tokens(10)
        .every(ms(80))
        .start_in_background();
    let fail = probe(&[
        "--url",
        &slower.url(),
        "-n",
        "2",
        "--baseline",
        base.to_str().unwrap(),
        "--assert",
        gates,
        "--json",
        slow.to_str().unwrap(),
    ]);
    let text = stdout(&fail);
    assert_eq!(fail.status.code(), Some(1), "{text}{}", stderr(&fail));
    assert!(
        text.contains("FAIL itl_p50<1.5*baseline: measured "),
        "{text}"
    );
    assert!(
        text.contains("FAIL tps_p50>0.5*baseline: measured "),
        "{text}"
    );

    let compare = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args([
            "probe",
            "compare",
            base.to_str().unwrap(),
            slow.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = stdout(&compare);
    assert_eq!(compare.status.code(), Some(0), "{}", stderr(&compare));
    assert!(text.starts_with("metric"), "{text}");
    assert!(
        text.lines().next().unwrap().contains("main.json") && text.contains("slow.json"),
        "{text}"
    );
    let itl = text.lines().find(|l| l.starts_with("itl_p50 ")).unwrap();
    // About 20 ms against 80 ms: +300%, with generous margins for a loaded machine.
    let pct: f64 = itl
        .split_whitespace()
        .last()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    assert!(pct > 100.0, "{itl}");
    let missing = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args([
            "probe",
            "compare",
            base.to_str().unwrap(),
            "/nonexistent/b.json",
        ])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn junit_and_markdown_reports() {
    let server = steady();
    let dir = tempfile::tempdir().unwrap();
    let (junit, md, summary) = (
        dir.path().join("r.xml"),
        dir.path().join("r.md"),
        dir.path().join("summary.md"),
    );
    std::fs::write(&summary, "earlier step\n").unwrap();
    let out = probe_with_env(
        &[
            "--url",
            &server.url(),
            "-n",
            "2",
            "--slo",
            "ttft<5s",
            "--assert",
            "errors<1,itl_p99<1us,goodput>=0.5",
            "--junit",
            junit.to_str().unwrap(),
            "--markdown",
            md.to_str().unwrap(),
        ],
        &[("GITHUB_STEP_SUMMARY", summary.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "),
        "{xml}"
    );
    assert!(
        xml.contains("tests=\"4\" failures=\"1\" errors=\"0\""),
        "{xml}"
    );
    assert!(xml.contains("name=\"itl_p99&lt;1us\""), "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains("name=\"run: 2 streams, 0 failed\""), "{xml}");
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.starts_with("## metronome probe: "), "{text}");
    assert!(text.contains("**failed**"), "{text}");
    assert!(text.contains("| `itl_p99<1us` | all | ❌ FAIL |"), "{text}");
    assert!(text.contains("| `errors<1` | all | ✅ pass |"), "{text}");
    assert!(text.contains("| 100.0% |"), "goodput column: {text}");
    let appended = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(appended, format!("earlier step\n{text}"));
}

#[test]
fn the_workload_reaches_the_server_as_asked() {
    let server = steady();
    let url = server.url();
    let out = probe(&[
        "--url",
        &url,
        "-n",
        "1",
        "--model",
        "m",
        "--input-tokens",
        "100",
        "--output-tokens",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("d.jsonl");
    std::fs::write(
        &dataset,
        "first prompt\n{\"messages\":[{\"role\":\"user\",\"content\":\"second\"}]}\n",
    )
    .unwrap();
    let out = probe(&[
        "--url",
        &url,
        "-n",
        "3",
        "--model",
        "m",
        "--dataset",
        dataset.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = probe(&[
        "--url",
        &url,
        "-n",
        "1",
        "--dataset",
        "/nonexistent/d.jsonl",
        "--model",
        "m",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot read the dataset"),
        "{}",
        stderr(&out)
    );

    let seen = server.seen.lock().unwrap();
    let bodies: Vec<serde_json::Value> = seen
        .bodies
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .collect();
    assert_eq!(bodies.len(), 4);
    let prompt = bodies[0]["messages"][0]["content"].as_str().unwrap();
    assert_eq!(prompt.split(' ').count(), 100);
    assert_eq!(bodies[0]["max_tokens"], 10);
    assert_eq!(bodies[0]["ignore_eos"], true);
    // The dataset, in order, cycling.
    let contents: Vec<&str> = bodies[1..]
        .iter()
        .map(|b| b["messages"][0]["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["first prompt", "second", "first prompt"]);
    assert!(bodies[1..]
        .iter()
        .all(|b| b["model"] == "m" && b["stream"] == true));
}

#[test]
fn a_rate_sweep_reports_a_row_per_rate() {
    let server = Upstream::sse()
        .tokens(4)
        .every(ms(10))
        .start_in_background();
    let dir = tempfile::tempdir().unwrap();
    let (json, md) = (dir.path().join("s.json"), dir.path().join("s.md"));
    let out = probe(&[
        "--url",
        &server.url(),
        "-n",
        "3",
        "--rate-sweep",
        "5,20",
        "--assert",
        "errors<1",
        "--json",
        json.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("sweep          rate "), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("5/s ")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("20/s ")),
        "{text}"
    );
    assert!(
        text.contains("[rate 5/s] PASS errors<1: measured 0"),
        "{text}"
    );
    assert!(
        text.contains("[rate 20/s] PASS errors<1: measured 0"),
        "{text}"
    );
    let report = read_json(&json);
    let rows = report["sweep"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0]["rate"].as_f64(), rows[1]["rate"].as_f64()),
        (Some(5.0), Some(20.0))
    );
    assert!(rows
        .iter()
        .all(|r| r["requests"] == 3 && r["meta"]["load"] == "open"));
    // Each rate has its gates and result; the sweep's result is theirs together.
    assert!(rows
        .iter()
        .all(|r| r["gates"][0]["gate"] == "errors<1" && r["gates"][0]["result"] == "pass"));
    assert_eq!(report["result"]["exit_code"], 0);
    assert_eq!(report["result"]["gates_passed"], 2);
    let table = std::fs::read_to_string(&md).unwrap();
    assert!(
        table.contains("| rate 5/s | 3 | 0 |") && table.contains("| rate 20/s | 3 | 0 |"),
        "{table}"
    );
    // A sweep is one report per rate; a single-run file is what --html and --baseline take.
    let html = probe(&[
        "--url",
        &server.url(),
        "--rate-sweep",
        "1,2",
        "--html",
        "x.html",
    ]);
    assert_eq!(html.status.code(), Some(2));
}
