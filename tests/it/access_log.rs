//! The access log as an operator greps it, from the real binary: a metered stream's line names
//! the request ID, method, path (no query), model, output tokens and finish reason, in whole
//! milliseconds; an upstream that fails mid-stream gets a warning naming both IDs.

use crate::support::child;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use child::{line_with, serve_with_access_log, stderr_lines};

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

fn event(json: &str) -> String {
    chunk(&format!("data: {json}\n\n"))
}

/// An OpenAI-style SSE upstream: three tokens, a stop and usage; a request whose head holds
/// `cut-me` gets two tokens and then the connection closes mid-body.
fn sse_upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || serve(&mut conn));
        }
    });
    addr
}

fn serve(conn: &mut TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    // The body (content-length bytes) is read and ignored.
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let _ = conn.read_exact(&mut body);
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    let token = |t: &str| {
        event(&format!(
            r#"{{"id":"c1","model":"llama-test","choices":[{{"index":0,"delta":{{"content":"{t}"}},"finish_reason":null}}]}}"#
        ))
    };
    out += &token("a");
    out += &token("b");
    if head.contains("cut-me") {
        let _ = conn.write_all(out.as_bytes());
        std::thread::sleep(Duration::from_millis(50));
        let _ = conn.shutdown(std::net::Shutdown::Both);
        return;
    }
    out += &token("c");
    out += &event(
        r#"{"id":"c1","model":"llama-test","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}"#,
    );
    out += &event("[DONE]");
    out += "0\r\n\r\n";
    let _ = conn.write_all(out.as_bytes());
}

fn post(listen: &str, request_id: &str) -> String {
    let body = r#"{"model":"llama-test","stream":true}"#;
    let mut conn = TcpStream::connect(listen).unwrap();
    write!(
        conn,
        "POST /v1/chat/completions?api_key=secret HTTP/1.1\r\nhost: x\r\nx-request-id: {request_id}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn a_stream_access_line_names_the_request_and_a_cut_stream_is_warned_of() {
    let upstream = sse_upstream();
    let (mut child, listen) = serve_with_access_log(upstream);
    let rx = stderr_lines(&mut child);
    let wait_for = |what: &[&str]| -> serde_json::Value {
        serde_json::from_str(&line_with(&rx, what)).unwrap()
    };
    let _ = wait_for(&["metronome serving"]);

    let response = post(&listen, "req-whole-1");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let line = wait_for(&["\"access\"", "req-whole-1"]);
    assert_eq!(line["request_id"], "req-whole-1", "{line}");
    assert_eq!(line["method"], "POST", "{line}");
    assert_eq!(line["path"], "/v1/chat/completions", "{line}");
    assert_eq!(line["model"], "llama-test", "{line}");
    assert_eq!(line["output_tokens"], 3, "{line}");
    assert_eq!(line["finish_reason"], "stop", "{line}");
    assert_eq!(line["outcome"], "complete", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["duration_ms"].is_u64(), "whole milliseconds: {line}");
    assert!(line["ttft_ms"].is_u64(), "whole milliseconds: {line}");
    assert!(line["stream_id"].is_string(), "{line}");
    assert!(!line.to_string().contains("secret"), "no query: {line}");

    let _ = post(&listen, "cut-me-2");
    let warning = wait_for(&["failed mid-stream", "cut-me-2"]);
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["request_id"], "cut-me-2", "{warning}");
    let stream_id = warning["stream_id"].as_str().unwrap().to_string();
    let line = wait_for(&["\"access\"", "cut-me-2"]);
    assert_eq!(line["stream_id"], stream_id.as_str(), "{line}");
    assert_eq!(line["outcome"], "upstream_error", "{line}");
    assert_eq!(line["finish_reason"], "error", "{line}");
}
