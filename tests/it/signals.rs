//! The real binary under real signals: `metronome serve` reloads on SIGHUP without touching a
//! stream in flight, refuses a broken file, and on SIGTERM drains the stream in flight, refuses
//! new connections and exits 0.
#![cfg(unix)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

/// `metronome serve` as a child process, with its log lines collected.
struct Served {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Served {
    fn start(config: &Path) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_metronome"))
            .args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(strip_ansi(&line));
            }
        });
        let mut served = Served {
            child,
            log,
            proxy: "0.0.0.0:0".parse().unwrap(),
            admin: "0.0.0.0:0".parse().unwrap(),
        };
        let line = served.wait_for_log("metronome serving");
        served.proxy = field(&line, "proxy=").parse().unwrap();
        served.admin = field(&line, "admin=").parse().unwrap();
        served
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// The first log line containing `text`, waiting up to 10 s for it.
    fn wait_for_log(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| l.contains(text)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with `{text}` in:\n{}",
                self.log.lock().unwrap().join("\n")
            );
            std::thread::sleep(ms(20));
        }
    }

    fn log_lines(&self, text: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .count()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line
        .find(name)
        .unwrap_or_else(|| panic!("{name} in {line}"))
        + name.len();
    line[start..].split_whitespace().next().unwrap()
}

fn write_config(path: &Path, upstream: SocketAddr, stall_threshold: &str) {
    std::fs::write(
        path,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "http://{upstream}"
drain_grace = "5s"
[metering]
stall_threshold = "{stall_threshold}"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
"#
        ),
    )
    .unwrap();
}

async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let got = request(admin, "GET", "/metrics", "", false).await;
    Metrics(String::from_utf8(got.bytes()).unwrap()).value(name, &[])
}

async fn stalls(admin: SocketAddr) -> f64 {
    let got = request(admin, "GET", "/metrics", "", false).await;
    Metrics(String::from_utf8(got.bytes()).unwrap())
        .value("metronome_stalls_total", &[("point", "ingress")])
}

#[tokio::test]
async fn sighup_reloads_the_threshold_without_touching_a_stream_and_refuses_a_broken_file() {
    // Every stream has one 150 ms pause, a stall only below a 150 ms threshold.
    let upstream = Upstream::openai_chat()
        .tokens(20)
        .every(ms(20))
        .stall_before(10, ms(150));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metronome.toml");
    write_config(&file, upstream.addr, "200ms");
    let served = Served::start(&file);
    let proxy = served.proxy;

    // At 200 ms the pause is no stall.
    assert_eq!(stream_chat(proxy).await.bytes(), expected);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(served.admin, "metronome_streams_total").await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the first stream was never recorded"
        );
        tokio::time::sleep(ms(20)).await;
    }
    assert_eq!(stalls(served.admin).await, 0.0);

    // Reload to 100 ms while a stream is in flight.
    let in_flight = tokio::spawn(async move { stream_chat(proxy).await });
    tokio::time::sleep(ms(50)).await;
    write_config(&file, upstream.addr, "100ms");
    served.signal(libc::SIGHUP);
    served.wait_for_log("metering.stall_threshold: 200ms -> 100ms");
    let got = in_flight.await.unwrap();
    assert!(got.error.is_none(), "{:?}", got.error);
    assert_eq!(got.bytes(), expected, "the stream in flight is untouched");

    // The next stream's pause is a stall.
    assert_eq!(stream_chat(proxy).await.bytes(), expected);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(served.admin, "metronome_streams_total").await < 3.0 {
        assert!(Instant::now() < deadline, "the streams were never recorded");
        tokio::time::sleep(ms(20)).await;
    }
    assert!(stalls(served.admin).await >= 1.0);

    std::fs::write(&file, "[metering]\nstall_threshold = \"soon\"\n").unwrap();
    served.signal(libc::SIGHUP);
    served.wait_for_log("reload refused");
    served.wait_for_log("key=metering.stall_threshold");
    assert_eq!(
        metric(served.admin, "metronome_config_reload_failures_total").await,
        1.0
    );
    // Still serving, with the last good configuration.
    assert_eq!(stream_chat(proxy).await.status, 200);
    assert_eq!(served.log_lines("configuration reloaded"), 1);
}

#[tokio::test]
async fn sigterm_drains_the_stream_in_flight_refuses_new_connections_and_exits_0() {
    let upstream = Upstream::openai_chat().tokens(40).every(ms(25));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metronome.toml");
    write_config(&file, upstream.addr, "200ms");
    let mut served = Served::start(&file);
    let proxy = served.proxy;

    let in_flight = tokio::spawn(async move { stream_chat(proxy).await });
    tokio::time::sleep(ms(200)).await;
    served.signal(libc::SIGTERM);
    served.wait_for_log("draining in-flight streams");
    tokio::time::sleep(ms(50)).await;
    assert!(
        tokio::net::TcpStream::connect(proxy).await.is_err(),
        "a new connection during the drain must be refused"
    );

    let got = in_flight.await.unwrap();
    assert!(got.error.is_none(), "{:?}", got.error);
    assert_eq!(got.bytes(), expected, "the stream in flight ran to its end");

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "metronome did not exit");
        std::thread::sleep(ms(20));
    };
    assert_eq!(status.code(), Some(0));
    served.wait_for_log("stopped");
}

/// The names of the process's threads, as the kernel has them (at most 15 bytes each).
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .collect()
}

#[tokio::test]
async fn serve_runs_server_workers_event_loops_or_one_shared_pool_as_configured() {
    let upstream = Upstream::openai_chat().tokens(5).every(ms(5));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    // One more thread than CPUs: a count that the defaults (one per CPU) would not give, so the
    // check fails if `server.workers` is ignored in either mode.
    let n = std::thread::available_parallelism().map_or(1, |n| n.get()) + 1;
    for (threading, workers, own_loops, pool_threads) in
        [("per_core", n, n, 0), ("shared", n, 0, n)]
    {
        let file = dir.path().join(format!("{threading}.toml"));
        write_config(&file, upstream.addr, "200ms");
        let text = std::fs::read_to_string(&file).unwrap().replace(
            "drain_grace = \"5s\"",
            &format!("drain_grace = \"5s\"\nworkers = {workers}\nthreading = \"{threading}\""),
        );
        std::fs::write(&file, text).unwrap();
        let mut served = Served::start(&file);
        served.wait_for_log(&format!("threading=\"{threading}\""));
        // Streams are served, whichever thread accepts them.
        let got = futures_util::future::join_all((0..6).map(|_| stream_chat(served.proxy))).await;
        for got in got {
            assert!(got.error.is_none(), "{threading}: {:?}", got.error);
            assert_eq!(got.bytes(), expected, "{threading}");
        }
        let names = thread_names(served.child.id());
        let count = |prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
        assert_eq!(
            count("metronome-worke"),
            own_loops,
            "{threading}: {names:?}"
        );
        assert_eq!(
            count("tokio-rt-worker"),
            pool_threads,
            "{threading}: {names:?}"
        );
        served.signal(libc::SIGTERM);
        served.wait_for_log("stopped");
        assert_eq!(served.child.wait().unwrap().code(), Some(0), "{threading}");
    }
}

#[tokio::test]
async fn a_drain_that_runs_out_of_grace_logs_how_many_streams_it_cut() {
    // 40 tokens 100 ms apart: four seconds, against a grace of one.
    let upstream = Upstream::openai_chat().tokens(40).every(ms(100));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metronome.toml");
    write_config(&file, upstream.addr, "200ms");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("drain_grace = \"5s\"", "drain_grace = \"1s\""),
    )
    .unwrap();
    let served = Served::start(&file);
    let proxy = served.proxy;

    let in_flight = tokio::spawn(async move { stream_chat(proxy).await });
    tokio::time::sleep(ms(300)).await;
    served.signal(libc::SIGTERM);
    let line = served.wait_for_log("drain grace over");
    assert!(line.contains("cuts 1 streams"), "{line}");
    assert_eq!(field(&line, "streams_cut="), "1", "{line}");
    let got = in_flight.await.unwrap();
    assert!(got.bytes().len() < expected.len(), "the stream was cut");
}
