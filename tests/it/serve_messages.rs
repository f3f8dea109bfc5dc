//! What `metronome serve` tells an operator, from the real binary: a bad value from a flag or an
//! environment variable names the flag or the variable (not a file key the file may not have),
//! "address in use" names the listener and its address, `--admin` takes a host name, and
//! `/metrics` is gzipped when the scraper asks.

use crate::support::child;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use child::{stderr_lines, Running};

fn serve(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_metronome"));
    command
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("METRONOME_CONFIG")
        .env_remove("METRONOME_ADMIN")
        .env_remove("METRONOME_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// Runs `serve` to its (failing) end within 20 s; its exit code and stderr.
fn failing(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Running(serve(args, env).stderr(Stdio::piped()).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (child.0.wait().unwrap().code(), stderr)
}

#[test]
fn a_bad_value_names_the_flag_or_the_variable_it_came_from() {
    let (code, stderr) = failing(&["--listen", "127.0.0.1:0", "--admin", "nonsense"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--admin: `nonsense`"), "{stderr}");
    assert!(!stderr.contains("server.admin"), "{stderr}");

    let (code, stderr) = failing(
        &["--listen", "127.0.0.1:0"],
        &[("METRONOME_ADMIN", "bad:99999")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("METRONOME_ADMIN: `bad:99999`"), "{stderr}");

    let (code, stderr) = failing(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--stall-threshold",
            "soon",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--stall-threshold:"), "{stderr}");
}

#[test]
fn address_in_use_names_the_listener_and_its_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, stderr) = failing(&["--listen", "127.0.0.1:0", "--admin", &addr], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("the admin listener (server.admin) {addr}")),
        "{stderr}"
    );
    let (_, stderr) = failing(&["--listen", &addr, "--admin", "127.0.0.1:0"], &[]);
    assert!(
        stderr.contains(&format!("the proxy listener (server.listen) {addr}")),
        "{stderr}"
    );
}

#[test]
fn the_admin_listener_takes_a_host_name_and_gzips_metrics_when_asked() {
    let mut child = Running(
        serve(&["--listen", "127.0.0.1:0", "--admin", "localhost:0"], &[])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rx = stderr_lines(&mut child);
    let line = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve started");
        if line.contains("metronome serving") {
            break line;
        }
    };
    let admin = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("admin="))
        .unwrap()
        .to_string();
    assert!(
        admin.starts_with("127.0.0.1:"),
        "localhost resolved to IPv4: {line}"
    );

    let get = |accept_encoding: Option<&str>| -> (String, Vec<u8>) {
        let mut conn = std::net::TcpStream::connect(&admin).unwrap();
        let extra = accept_encoding
            .map(|v| format!("accept-encoding: {v}\r\n"))
            .unwrap_or_default();
        write!(
            conn,
            "GET /metrics HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = Vec::new();
        conn.read_to_end(&mut response).unwrap();
        let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&response[..split]).to_lowercase();
        (head, response[split + 4..].to_vec())
    };
    let (head, plain) = get(None);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("content-encoding"), "{head}");
    let (head, gz) = get(Some("gzip, deflate"));
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("vary: accept-encoding"), "{head}");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    assert!(text.contains("# TYPE metronome_build_info"), "{text}");
    // A fresh process exports little (about 600 bytes); gzip still takes some off.
    assert!(
        gz.len() < plain.len(),
        "{} bytes gzipped of {}",
        gz.len(),
        plain.len()
    );
    let (head, _) = get(Some("gzip;q=0"));
    assert!(!head.contains("content-encoding"), "{head}");
}
