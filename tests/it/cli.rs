//! The binary as an operator meets it: exit codes, messages that name the key, environment
//! overrides, and the demo.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_metronome");

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn check_config_accepts_the_documented_example() {
    let out = Command::new(BIN)
        .args(["check-config", "config/metronome.toml"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("OK"));
}

#[test]
fn check_config_names_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        &dir,
        "bad.toml",
        "[server]\nlisten = \"nowhere\"\n[metering]\nstall_threshold = \"fast\"\n[[routes]]\nname = \"other\"\npath = \"/x\"\n",
    );
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "server.listen",
        "metering.stall_threshold",
        "routes[0].name",
    ] {
        assert!(err.contains(key), "{key} missing from: {err}");
    }
    let unknown = write(
        &dir,
        "unknown.toml",
        "[server]\nlisten_addr = \"0.0.0.0:1\"\n",
    );
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&unknown)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `listen_addr`"));
    let missing = dir.path().join("missing.toml");
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn serve_refuses_a_bad_config_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(&dir, "bad.toml", "[timeouts]\nidle = \"0s\"\n");
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timeouts.idle"));
}

/// An OTLP endpoint with user information is refused where it is written, and the password
/// reaches neither `check-config`'s answer nor `serve`'s log.
#[test]
fn otlp_endpoint_credentials_are_refused_and_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        &dir,
        "otlp.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[otlp]\nendpoint = \"http://user:s3cret@127.0.0.1:9\"\ninterval = \"1s\"\n",
    );
    let check = Command::new(BIN)
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(2));
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        err.contains("otlp.endpoint") && err.contains("line 5, column 12"),
        "{err}"
    );
    assert!(err.contains("[otlp] headers"), "{err}");
    let serve = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(2));
    for out in [&check.stdout, &check.stderr, &serve.stdout, &serve.stderr] {
        assert!(!String::from_utf8_lossy(out).contains("s3cret"));
    }
}

#[test]
fn environment_variables_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        &dir,
        "m.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n",
    );
    // An invalid value from the environment must be what serve complains about.
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .env("METRONOME_UPSTREAM", "not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // Named by the variable it came from, not by a file key the file does not have.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("METRONOME_UPSTREAM: "), "{stderr}");
    assert!(!stderr.contains("server.upstream"), "{stderr}");
}

#[test]
fn serve_starts_answers_health_and_stops_on_sigterm() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            break;
        }
        assert!(Instant::now() < deadline, "serve never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    send_sigterm(child.id());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

fn send_sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn demo_runs_and_reports_both_views() {
    let out = Command::new(BIN)
        .args([
            "demo",
            "--streams",
            "4",
            "--concurrency",
            "2",
            "--max-tokens",
            "12",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("What the client saw (probe)"), "{stdout}");
    assert!(stdout.contains("What metronome saw"), "{stdout}");
    assert!(stdout.contains("streams        4 in"), "{stdout}");
    // A reasoning model: the first report shows TTFT (the first thought) beside TTFO (the
    // answer, after a 100 ms think pause), from the probe and from metronome.
    let ms_after = |key: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} line: {stdout}"));
        let p50 = line.split("p50 ").nth(1).unwrap_or_default();
        let digits: String = p50
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let value: f64 = digits.parse().unwrap_or_else(|_| panic!("{line}"));
        if p50[digits.len()..].starts_with("ms") {
            value
        } else {
            value * 1e3
        }
    };
    assert!(
        ms_after("TTFO") >= ms_after("TTFT") + 90.0,
        "TTFO after the think pause: {stdout}"
    );
    assert!(stdout.contains("TTFO p50"), "metronome's view: {stdout}");
    let complete = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("streams complete"))
        .unwrap_or_default();
    assert!(complete.trim_end().ends_with(" 4"), "{complete}");
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn secrets_never_reach_the_logs_even_at_trace_level() {
    let (sim_port, proxy_port, admin_port) = (free_port(), free_port(), free_port());
    let mut sim = Command::new(BIN)
        .args([
            "sim",
            "--listen",
            &format!("127.0.0.1:{sim_port}"),
            "--gap",
            "2ms",
            "--ttft",
            "2ms",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{proxy_port}")])
        .args(["--admin", &format!("127.0.0.1:{admin_port}")])
        .args(["--upstream", &format!("http://127.0.0.1:{sim_port}")])
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    wait_listening(sim_port);
    wait_listening(proxy_port);
    for path in ["/v1/chat/completions", "/nowhere"] {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", proxy_port)).unwrap();
        let body = r#"{"stream":true,"max_tokens":3}"#;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer SECRET-TOKEN-42\r\nx-api-key: KEY-SECRET-7\r\ncookie: session=SECRET-COOKIE\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1"), "{answer}");
    }
    // An upstream failure is logged too: stop the sim and ask again.
    sim.kill().unwrap();
    let _ = sim.wait();
    let _ = std::process::Command::new("curl")
        .args(["-s", "-H", "authorization: Bearer SECRET-TOKEN-42"])
        .arg(format!("http://127.0.0.1:{proxy_port}/v1/chat/completions"))
        .output();
    send_sigterm(serve.id());
    let _ = serve.wait();
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(text.lines().count() > 5, "trace logging ran: {text}");
    for secret in ["SECRET-TOKEN-42", "KEY-SECRET-7", "SECRET-COOKIE"] {
        assert!(!text.contains(secret), "{secret} reached the logs");
    }
}
