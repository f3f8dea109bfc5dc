//! The binary's logging as an operator meets it: JSON lines on request, no colour codes off a
//! terminal, and a warning at startup when an https:// upstream meets an empty trust store.

use crate::support::child;

use std::process::{Command, Stdio};
use std::time::Duration;

use child::{line_with, serve_with_access_log, stderr_lines, Running};

/// Starts `serve` with an empty trust store and returns its first stderr lines (at most 8 s).
fn first_lines(upstream: &str, extra: &[&str]) -> Vec<String> {
    let empty = std::env::temp_dir().join(format!("metronome-empty-roots-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let empty_file = empty.join("none.pem");
    std::fs::write(&empty_file, "").unwrap();
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_metronome"))
            .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--upstream", upstream])
            .args(extra)
            .env("SSL_CERT_FILE", &empty_file)
            .env("SSL_CERT_DIR", &empty)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .env_remove("METRONOME_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rx = stderr_lines(&mut child);
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            // "metronome serving" comes after the state is built, so after the warning.
            Ok(line) => {
                let done = line.contains("metronome serving");
                lines.push(line);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    lines
}

#[test]
fn an_https_upstream_and_an_empty_trust_store_warn_at_startup_in_json() {
    let lines = first_lines("https://127.0.0.1:9", &["--log-format", "json"]);
    assert!(!lines.is_empty(), "no output");
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "colour off a terminal: {line:?}");
        let parsed: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object a line ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
    let warnings: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("trust store is empty"))
        .collect();
    assert_eq!(warnings.len(), 1, "{lines:#?}");
    assert!(
        warnings[0].contains("\"level\":\"WARN\""),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("https://127.0.0.1:9"),
        "{}",
        warnings[0]
    );
}

#[test]
fn a_plain_upstream_does_not_warn_and_text_has_no_colour_off_a_terminal() {
    let lines = first_lines("http://127.0.0.1:9", &[]);
    assert!(!lines.is_empty(), "no output");
    assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "{lines:#?}");
    assert!(
        lines.iter().all(|l| !l.contains("trust store")),
        "{lines:#?}"
    );
}

/// An upstream that answers every request with the same small JSON body (not a stream), on a
/// thread of its own; returns its address.
fn json_upstream() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let body = r#"{"object":"list","data":[]}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn a_passed_through_response_has_its_access_line() {
    use std::io::{Read, Write};
    let upstream = json_upstream();
    let (mut child, listen) = serve_with_access_log(upstream);
    let rx = stderr_lines(&mut child);
    let wait_for = |what: &str| -> String { line_with(&rx, &[what]) };
    wait_for("metronome serving");
    let mut conn = std::net::TcpStream::connect(&listen).unwrap();
    conn.write_all(b"GET /v1/models?key=secret HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.ends_with(r#"{"object":"list","data":[]}"#),
        "{response}"
    );

    let line: serde_json::Value = serde_json::from_str(&wait_for("\"access\"")).unwrap();
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["outcome"], "complete", "{line}");
    assert_eq!(line["route"], "other", "{line}");
    assert!(line["duration_ms"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(line.get("stream_id").is_none(), "{line}");
    assert!(
        !line.to_string().contains("secret"),
        "no query string: {line}"
    );
}
