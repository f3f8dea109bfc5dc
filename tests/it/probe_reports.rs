//! `metronome probe`'s reports agree with its exit code on every exit path: a pass, a failed
//! gate, a run where every stream failed, a model list that answered 401, a refused command
//! line. Also: a dead server is not hammered (attempts counted on a listener that accepts and
//! closes), the API key reaches the server and nothing else, the workloads of compared runs are
//! checked, and stdout and stderr interleave line by line. The built binary against the scripted
//! upstream of tests/support/upstream.rs and small raw servers of this file.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{ms, RunningUpstream, Upstream};

/// A key no server in these tests knows: it must reach the server and never a report or a log.
const KEY: &str = "sk-test-never-shown-4711";

fn probe(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::run_probe(args, env)
}

/// Asserts that `text` holds `needle`, showing the whole text when it does not.
fn has(text: &str, needle: &str) {
    assert!(text.contains(needle), "no `{needle}` in:\n{text}");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The four report files of a run, in a directory of their own.
struct Reports {
    _dir: tempfile::TempDir,
    json: PathBuf,
    junit: PathBuf,
    markdown: PathBuf,
    html: PathBuf,
}

impl Reports {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        Reports {
            json: at("r.json"),
            junit: at("r.xml"),
            markdown: at("r.md"),
            html: at("r.html"),
            _dir: dir,
        }
    }

    /// The flags that ask for every report.
    fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, path) in [
            ("--json", &self.json),
            ("--junit", &self.junit),
            ("--markdown", &self.markdown),
            ("--html", &self.html),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        args
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&self.json).unwrap()).unwrap()
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every report's text, to look for what must not be there.
    fn all(&self) -> String {
        [&self.json, &self.junit, &self.markdown, &self.html]
            .map(|p| Self::read(p))
            .concat()
    }

    /// Checks that each report leads with `headline` and the JSON's result has `exit_code`.
    fn check_headline(&self, headline: &str, exit_code: i32) {
        let json = self.json();
        assert_eq!(json["result"]["headline"], headline, "{json}");
        assert_eq!(json["result"]["exit_code"], exit_code, "{json}");
        let junit = Self::read(&self.junit);
        has(
            &junit,
            &format!("<property name=\"headline\" value=\"{headline}\"/>"),
        );
        has(
            &junit,
            &format!("<property name=\"exit_code\" value=\"{exit_code}\"/>"),
        );
        let markdown = Self::read(&self.markdown);
        assert!(
            markdown.starts_with(&format!("## metronome probe: {headline}\n")),
            "{markdown}"
        );
        let html = Self::read(&self.html);
        has(
            &html,
            &format!("<title>metronome probe: {headline}</title>"),
        );
        has(
            &html,
            &format!("<span class=\"v {headline}\">{headline}</span>"),
        );
    }
}

fn run_with_reports(url: &str, extra: &[&str], reports: &Reports) -> Output {
    let mut args: Vec<String> = vec!["--url".into(), url.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(reports.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    probe(&args, &[])
}

/// 10 token events 20 ms apart: short streams with a jank ratio each.
fn steady() -> RunningUpstream {
    Upstream::sse()
        .tokens(10)
        .every(ms(20))
        .start_in_background()
}

#[test]
fn a_passing_run_reports_its_gates_and_the_verdict_as_headline() {
    let server = steady();
    let reports = Reports::new();
    let out = run_with_reports(
        &server.url(),
        &["-n", "2", "--assert", "errors==0,itl_p99<5s"],
        &reports,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json = reports.json();
    let verdict = json["verdict"].as_str().unwrap().to_owned();
    reports.check_headline(&verdict, 0);
    let gates = json["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 2);
    assert_eq!(gates[0]["gate"], "errors==0");
    assert_eq!(gates[0]["op"], "==");
    assert_eq!(
        (gates[0]["value"].as_f64(), gates[0]["bound"].as_f64()),
        (Some(0.0), Some(0.0))
    );
    assert_eq!(gates[0]["result"], "pass");
    assert_eq!(gates[1]["unit"], "ms");
    assert_eq!(json["result"]["summary"], "every gate passed (2)");
    let stdout = text(&out.stdout);
    has(&stdout, "PASS errors==0: measured 0");
    assert!(
        stdout.ends_with(&format!(
            "result         {verdict}   (every gate passed (2))\n"
        )),
        "{stdout}"
    );
}

#[test]
fn a_failed_gate_makes_every_headline_fail_whatever_the_verdict() {
    let server = steady();
    let reports = Reports::new();
    let out = run_with_reports(
        &server.url(),
        &[
            "-n",
            "2",
            "--assert",
            "errors==0",
            "--assert",
            "itl_p99<1us",
        ],
        &reports,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    reports.check_headline("FAIL", 1);
    let json = reports.json();
    assert_eq!(json["gates"][1]["result"], "fail");
    assert!(json["gates"][1]["value"].as_f64().unwrap() > 0.001);
    assert_eq!(json["result"]["gates_failed"], 1);
    let summary = json["result"]["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("1 of 2 gates failed: itl_p99<1us; the verdict alone is "),
        "{summary}"
    );
    let html = Reports::read(&reports.html);
    assert!(!html.contains("class=\"v SMOOTH\""), "{html}");
    has(&html, "<h2>Result</h2>");
    has(
        &html,
        "<tr class=\"fail\"><td><code>itl_p99&lt;1us</code></td><td>measured ",
    );
    has(
        &html,
        "<tr class=\"pass\"><td><code>errors==0</code></td><td>measured 0</td>",
    );
    let junit = Reports::read(&reports.junit);
    has(
        &junit,
        "<failure type=\"gate\" message=\"FAIL itl_p99&lt;1us: measured ",
    );
    let markdown = Reports::read(&reports.markdown);
    has(&markdown, "| `itl_p99<1us` | all | ❌ FAIL | measured ");
}

/// A server that answers every request 401 with a body that echoes the request's
/// `Authorization` (as some do), and keeps every request head it read.
struct Refusing {
    url: String,
    heads: Arc<Mutex<Vec<String>>>,
}

fn refusing_server() -> Refusing {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let kept = kept.clone();
            std::thread::spawn(move || answer_401(stream, &kept));
        }
    });
    Refusing { url, heads }
}

/// Reads one request (head and body) and answers 401, echoing its `Authorization`.
fn answer_401(stream: TcpStream, heads: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap_or(0);
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let answer = format!(
        "{{\"error\":{{\"message\":\"Incorrect API key provided: {}\",\"type\":\"invalid_request_error\"}}}}",
        header("authorization")
    );
    heads.lock().unwrap().push(head);
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

#[test]
fn a_model_list_that_answers_401_still_writes_every_report_with_the_cause() {
    let server = refusing_server();
    let reports = Reports::new();
    let out = run_with_reports(
        &server.url,
        &["-n", "2", "--api-key", KEY, "--assert", "errors==0"],
        &reports,
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    reports.check_headline("ERROR", 3);
    let json = reports.json();
    assert_eq!(json["requests"], 0);
    assert_eq!(json["gates"][0]["result"], "not_measured");
    let failure = &json["result"]["failure"];
    assert_eq!(failure["kind"], "discovery");
    assert_eq!(
        failure["message"],
        "no --model given, and none could be found"
    );
    let cause = failure["causes"][0].as_str().unwrap();
    has(cause, "/v1/models answered 401: ");
    has(cause, "Incorrect API key provided: Bearer ***");
    assert_eq!(
        json["meta"]["url"],
        format!("{}/v1/chat/completions", server.url)
    );
    let junit = Reports::read(&reports.junit);
    has(
        &junit,
        "<error type=\"discovery\" message=\"no --model given, and none could be found: GET ",
    );
    has(&junit, "answered 401: {&quot;error&quot;");
    has(
        &junit,
        "<skipped message=\"NOT MEASURED errors==0: the run did not take place\"/>",
    );
    let html = Reports::read(&reports.html);
    has(&html, "<strong>The run failed (discovery):</strong>");
    let markdown = Reports::read(&reports.markdown);
    has(&markdown, "| `errors==0` | all | ⚪ not measured |");
    let stdout = text(&out.stdout);
    has(
        &stdout,
        "NOT MEASURED errors==0: the run did not take place",
    );
    has(
        &stdout,
        "result         ERROR   (the run failed: no --model given",
    );

    // The key went to the server as a bearer token with the probe's User-Agent, and nowhere
    // else: not in a report, not on stdout or stderr, though the server echoed it.
    let heads = server.heads.lock().unwrap();
    assert!(heads[0].starts_with("GET /v1/models "), "{}", heads[0]);
    assert!(
        heads[0].contains(&format!("authorization: Bearer {KEY}\r\n")),
        "{}",
        heads[0]
    );
    let agent = format!(
        "user-agent: metronome-probe/{}\r\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(heads[0].contains(&agent), "{}", heads[0]);
    let shown = reports.all() + &text(&out.stdout) + &text(&out.stderr);
    assert!(!shown.contains(KEY), "{shown}");
    assert!(!shown.contains("never-shown"), "{shown}");
}

#[test]
fn a_run_where_every_stream_failed_reports_the_status_and_body_it_got() {
    let server = refusing_server();
    let reports = Reports::new();
    let out = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "--url", &server.url, "-n", "3", "--model", "m"])
        .args(["--assert", "errors==0"])
        .args(reports.args())
        .env("OPENAI_API_KEY", KEY)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    reports.check_headline("ERROR", 3);
    let json = reports.json();
    assert_eq!(
        (json["requests"].as_u64(), json["errors"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(json["gates"][0]["result"], "fail");
    assert_eq!(json["gates"][0]["value"], 3.0);
    let failure = &json["result"]["failure"];
    assert_eq!(failure["kind"], "no_stream_completed");
    assert_eq!(failure["message"], "no stream completed (3 of 3 failed)");
    assert_eq!(
        failure["causes"][0],
        "status (3): the server answered with status 401: {\"error\":{\"message\":\"Incorrect \
         API key provided: Bearer ***\",\"type\":\"invalid_request_error\"}}"
    );
    let junit = Reports::read(&reports.junit);
    has(&junit, "<error type=\"no_stream_completed\" message=\"no stream completed (3 of 3 failed): status (3): the server answered with status 401: ");
    // OPENAI_API_KEY is sent as the key, and shown nowhere.
    let heads = server.heads.lock().unwrap();
    assert_eq!(heads.len(), 3);
    assert!(heads
        .iter()
        .all(|h| h.starts_with("POST /v1/chat/completions ")
            && h.contains(&format!("authorization: Bearer {KEY}\r\n"))));
    let shown = reports.all() + &text(&out.stdout) + &text(&out.stderr);
    assert!(!shown.contains(KEY), "{shown}");
}

#[test]
fn a_refused_command_line_still_writes_the_reports_asked_for() {
    let reports = Reports::new();
    let out = run_with_reports(
        "http://127.0.0.1:9/v1/chat/completions",
        &["--assert", "errors==0", "--slo", "ttft<500"],
        &reports,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    reports.check_headline("ERROR", 2);
    let failure = &reports.json()["result"]["failure"];
    assert_eq!(failure["kind"], "usage");
    assert!(
        failure["message"]
            .as_str()
            .unwrap()
            .contains("needs a duration"),
        "{failure}"
    );
    assert!(Reports::read(&reports.junit)
        .contains("<error type=\"usage\" message=\"objective `ttft&lt;500` needs"));
}

/// A listener that accepts every connection and closes it at once, counting them: a server that
/// is up but serves nothing.
fn closing_listener() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            count.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (url, accepted)
}

#[test]
fn a_dead_server_gets_a_bounded_number_of_attempts_and_the_run_ends_early() {
    let (url, accepted) = closing_listener();
    let started = Instant::now();
    let out = probe(
        &[
            "--url",
            &url,
            "--model",
            "m",
            "--duration",
            "30s",
            "-c",
            "4",
        ],
        &[],
    );
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // The first 8 streams to end all failed, so no more started: the 4 workers' streams in
    // flight when the 8th ended are the most there can be beyond those.
    let attempts = accepted.load(Ordering::SeqCst);
    assert!(
        (8..=12).contains(&attempts),
        "{attempts} connection attempts"
    );
    // A closed loop without backoff ran thousands of attempts in that time; the run ends in
    // about a second, far from its 30 s.
    assert!(took < Duration::from_secs(20), "{took:?}");
    let stderr = text(&out.stderr);
    has(
        &stderr,
        "the run ended early, as the first 8 streams to end all failed",
    );

    // A port nothing listens on: refused connections end the run the same way.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!(
        "http://{}/v1/chat/completions",
        closed.local_addr().unwrap()
    );
    drop(closed);
    let started = Instant::now();
    let out = probe(
        &["--url", &refused, "--model", "m", "--duration", "30s"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(20));
    let stdout = text(&out.stdout);
    has(&stdout, "streams        8 in ");
}

#[test]
fn baselines_and_compare_warn_when_the_workloads_differ() {
    let server = Upstream::sse()
        .tokens(4)
        .every(ms(10))
        .start_in_background();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let url = server.url();
    let run = |path: &Path, extra: &[&str]| {
        let mut args = vec![
            "--url",
            url.as_str(),
            "-n",
            "2",
            "--json",
            path.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        probe(&args, &[])
    };
    assert_eq!(run(&a, &[]).status.code(), Some(0));
    let against = run(
        &b,
        &[
            "-c",
            "2",
            "--max-tokens",
            "16",
            "--baseline",
            a.to_str().unwrap(),
        ],
    );
    assert_eq!(against.status.code(), Some(0), "{}", text(&against.stderr));
    let warning = "warning: the workloads of a.json and this run differ, so the deltas measure \
                   that too: concurrency 1 against 2, workload.max_tokens 64 against 16";
    assert!(
        text(&against.stderr).contains(warning),
        "{}",
        text(&against.stderr)
    );

    let compare = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "compare", a.to_str().unwrap(), b.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(compare.status.code(), Some(0));
    assert!(
        text(&compare.stderr).contains("warning: the workloads of a.json and b.json differ"),
        "{}",
        text(&compare.stderr)
    );
    // The same workload twice: no warning.
    let same = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "compare", a.to_str().unwrap(), a.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !text(&same.stderr).contains("warning"),
        "{}",
        text(&same.stderr)
    );
}

#[test]
fn stdout_and_stderr_interleave_in_the_order_they_were_written() {
    // Both streams into one file, as a CI log captures `2>&1`: the text report and its result
    // line (stdout) come before the failure explained after them (stderr), never after it.
    let (url, _) = closing_listener();
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "--url", &url, "--model", "m", "-n", "2"])
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3));
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let at = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {log}"))
    };
    assert!(
        at("metronome probe: 2 streams to ") < at("streams        2 in "),
        "{log}"
    );
    assert!(
        at("verdict        JANKY") < at("result         ERROR"),
        "{log}"
    );
    assert!(
        at("result         ERROR") < at("error: the run failed: "),
        "{log}"
    );
}

#[test]
fn the_readme_and_help_list_every_gate_and_the_verdict_rule() {
    let help = Command::new(env!("CARGO_BIN_EXE_metronome"))
        .args(["probe", "--help"])
        .output()
        .unwrap();
    let help = text(&help.stdout);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (help_words, readme_words) = (words(&help), words(&readme));
    for (name, _) in metronome::probe::gates::METRICS {
        assert!(help.contains(name), "probe --help lacks the gate {name}");
        assert!(
            readme.contains(&format!("`{name}`")),
            "README lacks the gate `{name}`"
        );
    }
    for rule in [
        metronome::probe::verdict::RULE,
        metronome::probe::backoff::RULE,
    ] {
        assert!(help_words.contains(rule), "probe --help lacks: {rule}");
        assert!(readme_words.contains(rule), "README lacks: {rule}");
    }
    has(&help, "--api-key <KEY>");
    has(&help, "[env: OPENAI_API_KEY");
    for flag in ["--think-tags <OPEN,CLOSE>", "--think-starts-open"] {
        has(&help, flag);
        let name = flag.split(' ').next().unwrap();
        assert!(readme.contains(name), "README lacks {name}");
    }
}
