//! The metronome binary as a child process, for the tests that read what it prints: a guard that
//! kills it, its stderr line by line, and `serve` with JSON access lines on a free port.
//!
//! The tests that use only this part include it alone (`#[path = "support/child.rs"]`), since
//! they run the binary and need none of the in-process helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Kills the child when the test ends, however it ends.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child's stderr, line by line, as a thread reads it.
pub fn stderr_lines(child: &mut Running) -> mpsc::Receiver<String> {
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line from `rx` that contains every one of `what`, within 20 s; panics without one.
pub fn line_with(rx: &mpsc::Receiver<String>, what: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if what.iter().all(|w| line.contains(w)) => return line,
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    panic!("no line with {what:?} within 20 s");
}

/// `metronome serve` in front of `upstream` on a free port of 127.0.0.1, with JSON logs and
/// access lines on its stderr (`RUST_LOG=info`); the child and the address it listens on.
pub fn serve_with_access_log(upstream: SocketAddr) -> (Running, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let child = Running(
        Command::new(env!("CARGO_BIN_EXE_metronome"))
            .args(["serve", "--listen", &listen, "--admin", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--log-format", "json", "--access-log"])
            .env("RUST_LOG", "info")
            .env_remove("METRONOME_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    (child, listen)
}
