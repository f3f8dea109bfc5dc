//! The documents cannot drift from the code.
//!
//! - Metrics: the proxy runs in-process and gets traffic that makes every family appear (streams
//!   with a stall caught by two streams at once, a non-streaming answer, an unparsable event, an
//!   unreachable upstream, objectives, a beacon, OTLP export to a receiver that is not there); the
//!   families `/metrics` exports, and those the source registers, must each have a row of the
//!   right type and labels in docs/metrics.md and a row in README's metric table, and every
//!   family those tables name must be exported.
//! - Paths: every repository path (and every `scripts/*`) README, ARCHITECTURE.md and docs/ name
//!   must exist.
//! - Config keys: every `section.key` they name must be in config/metronome.toml.
//! - Links: every relative link must resolve, down to the heading it names.
//!
//! Each failure names what is missing, so a change that adds a family, moves a file or renames a
//! heading is told exactly which line to write.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use support::*;

/// The documents held to the code: README, ARCHITECTURE.md, and every page of docs/.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The text outside fenced code blocks, line by line (a code block shows commands and output,
/// not claims about the tree).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// The backticked spans of a line.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Fails with every problem, one a line.
fn assert_none(problems: Vec<String>) {
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// === the metric tables ===

/// A row of docs/metrics.md's metric table.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    kind: String,
    labels: BTreeSet<String>,
}

/// The cells of each row of the table whose header line starts with `header` (the cells
/// trimmed; the first, before the opening `|`, empty).
fn table_cells<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
    text.lines()
        .skip_while(|line| !line.starts_with(header))
        .skip(1)
        .take_while(|line| line.starts_with('|'))
        .filter(|line| !line.starts_with("|---"))
        .map(|line| line.split('|').map(str::trim).collect())
        .collect()
}

/// docs/metrics.md's table (`| metric | type | labels | meaning |`): each family's type and
/// labels.
fn metrics_doc_rows(text: &str) -> BTreeMap<String, Row> {
    let mut rows = BTreeMap::new();
    for cells in table_cells(text, "| metric | type | labels |") {
        let name = cells[1].trim_matches('`').to_string();
        let labels = cells[3]
            .split(',')
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        rows.insert(
            name,
            Row {
                kind: cells[2].to_string(),
                labels,
            },
        );
    }
    rows
}

/// The families README's table (`| metric | what it tells you |`) names: its first column's
/// names, written without the `metronome_` prefix and with their labels in braces.
fn readme_rows(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for cells in table_cells(text, "| metric | what it tells you |") {
        for span in code_spans(cells[1]) {
            let name = span.split('{').next().unwrap().trim();
            let name = if name.starts_with("metronome_") {
                name.to_string()
            } else {
                format!("metronome_{name}")
            };
            names.insert(name);
        }
    }
    names
}

/// The families of a text exposition (0.0.4): each `# TYPE`'s type, and the label names its
/// samples carry (`le` aside).
fn exported_families(exposition: &str) -> BTreeMap<String, Row> {
    let mut families: BTreeMap<String, Row> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            families.insert(
                name.to_string(),
                Row {
                    kind: kind.to_string(),
                    labels: BTreeSet::new(),
                },
            );
        }
    }
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let series = line.split_whitespace().next().unwrap_or("");
        let (sample, labels) = match series.split_once('{') {
            Some((sample, labels)) => (sample, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| sample.strip_suffix(suffix))
            .filter(|base| families.get(*base).is_some_and(|r| r.kind == "histogram"))
            .unwrap_or(sample);
        let Some(row) = families.get_mut(family) else {
            continue;
        };
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            if let Some((name, _)) = pair.split_once('=') {
                if name != "le" {
                    row.labels.insert(name.to_string());
                }
            }
        }
    }
    families
}

/// The families the source registers: every `"metronome_…"` string literal in src/ outside
/// comments (a family's name is written once, where it is registered, and where OTLP renames
/// it).
fn registered_families() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut folders = vec![root().join("src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            for line in read(&path).lines() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for (at, _) in line.match_indices("\"metronome_") {
                    let rest = &line[at + 1..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // `"metronome_"` alone is the prefix, not a family.
                    if rest[name.len()..].starts_with('"') && name.len() > "metronome_".len() {
                        found.insert(name);
                    }
                }
            }
        }
    }
    found
}

/// A row to paste, for a failure message.
fn row_for(name: &str, row: Option<&Row>) -> String {
    match row {
        Some(row) => format!(
            "| `{name}` | {} | {} | ... |",
            row.kind,
            row.labels.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
        None => format!("| `{name}` | TYPE | LABELS | ... |"),
    }
}

/// Compares what is exported and registered with docs/metrics.md's and README's tables; every
/// difference, as a line saying what to write where.
fn metric_table_problems(exported: &BTreeMap<String, Row>) -> Vec<String> {
    let doc = metrics_doc_rows(&read(&root().join("docs/metrics.md")));
    let readme = readme_rows(&read(&root().join("README.md")));
    let registered = registered_families();
    let mut problems = Vec::new();
    let all: BTreeSet<&String> = exported.keys().chain(registered.iter()).collect();
    for name in &all {
        let row = exported.get(*name);
        let how = if row.is_some() {
            "exported"
        } else {
            "registered in src/"
        };
        match (doc.get(*name), row) {
            (None, _) => problems.push(format!(
                "docs/metrics.md has no row for {name} ({how}); add: {}",
                row_for(name, row)
            )),
            (Some(documented), Some(row)) if documented != row => problems.push(format!(
                "docs/metrics.md's row for {name} says {} with labels [{}]; /metrics exports {} with labels [{}]: {}",
                documented.kind,
                documented.labels.iter().cloned().collect::<Vec<_>>().join(", "),
                row.kind,
                row.labels.iter().cloned().collect::<Vec<_>>().join(", "),
                row_for(name, Some(row))
            )),
            _ => {}
        }
        if !readme.contains(*name) {
            let short = name.trim_start_matches("metronome_");
            problems.push(format!(
                "README's metric table has no row for {name} ({how}); add: | `{short}` | ... |"
            ));
        }
    }
    for name in doc.keys() {
        if !exported.contains_key(name) {
            problems.push(format!(
                "docs/metrics.md has a row for {name}, which /metrics does not export"
            ));
        }
    }
    for name in &readme {
        if !exported.contains_key(name) {
            problems.push(format!(
                "README's metric table names {name}, which /metrics does not export"
            ));
        }
    }
    problems
}

/// Sends a request with extra header fields and reads its whole answer; the status.
async fn send(addr: std::net::SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> u16 {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(
            request
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

/// Reads a stream's first 32 KiB through a small receive buffer, stops reading for 2.5 s
/// (the proxy's queue fills: backpressure), then reads it to the end.
async fn read_slowly(addr: std::net::SocketAddr, path: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < 32 * 1024 {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        got += n;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    while stream.read(&mut buf).await.unwrap() > 0 {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_is_in_the_tables_and_every_row_is_exported() {
    // Two streams whose 300 ms stalls overlap: each a stall and a hitch, together an episode.
    let stalling = Upstream::openai_chat()
        .tokens(20)
        .every(ms(20))
        .stall_before(12, ms(300))
        .start()
        .await;
    let answer = Upstream::json(r#"{"choices":[{"message":{"content":"hi"}}]}"#)
        .start()
        .await;
    let unparsable = Upstream::sse_frames(
        &[
            Bytes::from_static(
                b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            ),
            Bytes::from_static(b"data: {\"choices\": [oops\n\n"),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ],
        ms(5),
    )
    .start()
    .await;
    // A stream that reasons, then answers, and reports its reasoning tokens: TTFO, the reasoning
    // duration and the reasoning token counter.
    let reasoning = Upstream::sse_frames(
        &[
            Bytes::from_static(
                b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
            ),
            Bytes::from_static(
                b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"reasoning_content\":\"so\"}}]}\n\n",
            ),
            Bytes::from_static(
                b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            ),
            Bytes::from_static(
                b"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\n",
            ),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ],
        ms(5),
    )
    .start()
    .await;
    // A stream a client stops reading: backpressure.
    let held: Vec<Bytes> = (0..2_000)
        .map(|n| {
            Bytes::from(format!(
                "data: {{\"model\":\"m\",\"choices\":[{{\"delta\":{{\"content\":\"{n:05}{}\"}}}}]}}\n\n",
                "x".repeat(4090)
            ))
        })
        .chain(std::iter::once(Bytes::from_static(b"data: [DONE]\n\n")))
        .collect();
    let held = Upstream::sse_frames(&held, ms(1)).start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let otlp = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let toml = format!(
        r#"{}
[[routes]]
name = "answer"
path = "/v1/answer"
upstream = "http://{}"
[[routes]]
name = "odd"
path = "/v1/odd"
upstream = "http://{}"
format = "openai"
[[routes]]
name = "reasoning"
path = "/v1/reasoning"
upstream = "http://{}"
format = "openai"
[[routes]]
name = "held"
path = "/v1/held"
upstream = "http://{}"
format = "openai"
[[routes]]
name = "down"
path = "/v1/down"
upstream = "http://{closed}"
[otlp]
endpoint = "http://{otlp}"
interval = "1s"
timeout = "1s"
traces = true
# Two streams stalled at once are an episode by the floors alone (the chance rule, which would
# want more streams, is docs/batch.md's and tested in tests/batch_chance.rs).
[batch]
false_positive = 1.0
"#,
        proxy_toml(stalling.addr),
        answer.addr,
        unparsable.addr,
        reasoning.addr,
        held.addr
    );
    let mut config = metronome::config::Config::from_toml(&toml).unwrap();
    config.readiness.check_upstream = false;
    let proxy = metronome::proxy::ProxyHandle::start(config).await.unwrap();
    let addr = proxy.proxy_addr;
    let chat = r#"{"model":"test-model","stream":true}"#;
    let objectives = [
        ("x-llm-d-slo-ttft-ms", "5000"),
        ("x-llm-d-slo-tpot-ms", "1000"),
    ];
    let (a, b) = tokio::join!(
        send(addr, "/v1/chat/completions", chat, &objectives),
        send(addr, "/v1/chat/completions", chat, &[])
    );
    assert_eq!((a, b), (200, 200));
    assert_eq!(send(addr, "/v1/answer", "{}", &[]).await, 200);
    assert_eq!(send(addr, "/v1/odd", chat, &[]).await, 200);
    assert_eq!(send(addr, "/v1/reasoning", chat, &[]).await, 200);
    read_slowly(addr, "/v1/held").await;
    assert_eq!(send(addr, "/v1/down", chat, &[]).await, 502);
    let beacon = send(addr, "/.well-known/metronome/beacon", "not a beacon", &[]).await;
    assert_eq!(beacon, 400);
    // A WebSocket upgrade that is not a GET: refused, and counted with the tunnels.
    let upgrade = [("connection", "upgrade"), ("upgrade", "websocket")];
    assert_eq!(send(addr, "/v1/realtime", "", &upgrade).await, 400);

    // Every family the tables name shows once the streams are recorded and the episode ends.
    let deadline = Instant::now() + Duration::from_secs(20);
    let problems = loop {
        let scraped = scrape(&proxy).await;
        let problems = metric_table_problems(&exported_families(&scraped.0));
        if problems.is_empty() || Instant::now() > deadline {
            break problems;
        }
        tokio::time::sleep(ms(100)).await;
    };
    proxy.shutdown().await;
    assert!(
        problems.is_empty(),
        "the metric tables and /metrics differ:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_table_readers_read_rows_and_the_exposition() {
    let doc = "| metric | type | labels | meaning |\n|---|---|---|---|\n| `metronome_a_total` | counter | route, kind | x |\n| `metronome_b` | gauge | | y |\n\nafter";
    let rows = metrics_doc_rows(doc);
    assert_eq!(rows["metronome_a_total"].kind, "counter");
    assert_eq!(
        rows["metronome_a_total"].labels,
        ["kind", "route"].map(String::from).into()
    );
    assert!(rows["metronome_b"].labels.is_empty());
    let readme = "| metric | what it tells you |\n|---|---|\n| `a_total{route}` and `b` | x |\n";
    assert_eq!(
        readme_rows(readme),
        ["metronome_a_total", "metronome_b"]
            .map(String::from)
            .into()
    );
    let exposition = "# HELP metronome_h h\n# TYPE metronome_h histogram\nmetronome_h_bucket{route=\"r\",le=\"1\"} 1\nmetronome_h_sum{route=\"r\"} 1\n# TYPE metronome_c_total counter\nmetronome_c_total 3\n";
    let families = exported_families(exposition);
    assert_eq!(families["metronome_h"].kind, "histogram");
    assert_eq!(
        families["metronome_h"].labels,
        ["route"].map(String::from).into()
    );
    assert!(families["metronome_c_total"].labels.is_empty());
}

// === paths ===

/// File names metronome's documents give paths with.
const EXTENSIONS: [&str; 12] = [
    "rs", "md", "sh", "py", "toml", "yml", "yaml", "json", "js", "html", "service", "txt",
];

/// Whether `token` reads as a path in the tree: no spaces or URL parts, and a file name with an
/// extension metronome uses, or a folder (ending in `/`).
fn looks_like_path(token: &str) -> bool {
    if token.is_empty()
        || token.contains(char::is_whitespace)
        || token.contains("://")
        || token.contains("::")
        || token.starts_with('/')
        || token.starts_with('.')
        || token.contains('{')
        || token.contains('=')
    {
        return false;
    }
    if let Some(folder) = token.strip_suffix('/') {
        return !folder.is_empty()
            && folder
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-/.".contains(c));
    }
    let name = token.rsplit('/').next().unwrap();
    let Some((stem, extension)) = name.rsplit_once('.') else {
        return false;
    };
    !stem.is_empty()
        && EXTENSIONS.contains(&extension)
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-/.*".contains(c))
}

/// Whether `candidate` (relative to the root, possibly with `*`) names something in the tree.
fn exists(candidate: &Path) -> bool {
    let text = candidate.to_string_lossy();
    if !text.contains('*') {
        return candidate.exists();
    }
    let (Some(parent), Some(pattern)) = (candidate.parent(), candidate.file_name()) else {
        return false;
    };
    let pattern = pattern.to_string_lossy();
    let (before, after) = pattern.split_once('*').unwrap();
    std::fs::read_dir(parent).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.len() >= before.len() + after.len()
                && name.starts_with(before)
                && name.ends_with(after)
        })
    })
}

/// The folders a line's bare names may be under: those its heading names, and those the list
/// item it belongs to names (`- \`scripts/\`, in groups:` for the items under it).
#[derive(Debug, Default)]
struct Context {
    heading: Vec<String>,
    item: Vec<String>,
}

fn folders_in(line: &str) -> Vec<String> {
    code_spans(line)
        .into_iter()
        .filter(|s| s.ends_with('/') && looks_like_path(s))
        .map(String::from)
        .collect()
}

/// Where a path named in `document` may be: from the root, from `src/` (ARCHITECTURE.md's code
/// map names paths under `src/`), from the document's own folder, under a folder its context
/// names, or beside a path named on the same line. A bare file name (`mod.rs` in a folder's
/// section, `metronome.toml` in a row about its kustomization) is enough when a file of that
/// name is anywhere in the tree.
fn path_resolves(token: &str, document: &Path, context: &Context, line: &str) -> bool {
    let root = root();
    let here = document.parent().unwrap().to_path_buf();
    let mut bases = vec![root.clone(), root.join("src"), here];
    for folder in context.heading.iter().chain(&context.item) {
        bases.push(root.join(folder));
        bases.push(root.join("src").join(folder));
    }
    for span in code_spans(line).into_iter().filter(|s| looks_like_path(s)) {
        if let Some(parent) = Path::new(span).parent() {
            bases.push(root.join(parent));
        }
    }
    if bases.iter().any(|base| exists(&base.join(token))) {
        return true;
    }
    !token.contains('/') && file_names().contains(token)
}

/// The name of every file in the tree (build output and git's own files aside).
fn file_names() -> &'static BTreeSet<String> {
    static NAMES: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = BTreeSet::new();
        let mut folders = vec![root()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap().filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let path = entry.path();
                if path.is_dir() {
                    if name != "target" && name != ".git" {
                        folders.push(path);
                    }
                } else {
                    names.insert(name);
                }
            }
        }
        names
    })
}

/// Every path the documents name that is not in the tree, with where it is named.
/// docs/perf-history.md is left out: it records earlier rounds with the paths of their time, and
/// hyper's own files, which are not this tree's.
fn missing_paths() -> Vec<String> {
    let mut missing = Vec::new();
    for document in documents() {
        if document.ends_with("docs/perf-history.md") {
            continue;
        }
        let text = read(&document);
        let mut context = Context::default();
        for (n, line) in prose_lines(&text) {
            if line.starts_with('#') {
                context.heading = folders_in(line);
                context.item.clear();
            } else if line.starts_with("- ") {
                context.item = folders_in(line);
            } else if line.trim().is_empty() {
                context.item.clear();
            }
            let mut tokens: Vec<String> = code_spans(line)
                .into_iter()
                .filter(|s| looks_like_path(s))
                .map(String::from)
                .collect();
            // Paths written without backticks: a word with a folder and a file name.
            for word in line.split(|c: char| c.is_whitespace() || "()[],;:`\"'".contains(c)) {
                let word = word.trim_end_matches('.');
                if word.contains('/') && !word.ends_with('/') && looks_like_path(word) {
                    tokens.push(word.to_string());
                }
            }
            for token in tokens {
                if !path_resolves(&token, &document, &context, line) {
                    missing.push(format!(
                        "{}:{n} names {token}, which is not in the tree",
                        relative(&document)
                    ));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

#[test]
fn every_path_the_documents_name_exists() {
    assert_none(missing_paths());
}

#[test]
fn a_path_is_told_from_other_code() {
    for path in [
        "src/proxy/forward.rs",
        "scripts/e2e*.sh",
        "deploy/docker/",
        "mod.rs",
        "docs/metrics.md",
    ] {
        assert!(looks_like_path(path), "{path}");
    }
    for other in [
        "text/event-stream",
        "/v1/chat/completions",
        "http://127.0.0.1:8000",
        "http1::head",
        "metrics.flush_interval",
        "v1/{server, client}",
        "a = b.rs",
    ] {
        assert!(!looks_like_path(other), "{other}");
    }
}

// === configuration keys ===

/// `section.key` spans whose first part is a table of config/metronome.toml but that are not
/// keys: OpenTelemetry attribute names that happen to start the same way.
const NOT_KEYS: [&str; 2] = ["server.address", "server.port"];

/// Whether `path` (dotted) is a key or table of `table`, looking into arrays of tables.
fn has_key(table: &toml::Value, path: &[&str]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    match table {
        toml::Value::Table(t) => t.get(*first).is_some_and(|v| has_key(v, rest)),
        toml::Value::Array(items) => items.iter().any(|v| has_key(v, path)),
        _ => false,
    }
}

/// Every `section.key` the documents name that config/metronome.toml does not have.
fn missing_keys() -> Vec<String> {
    let config: toml::Value = toml::from_str(&read(&root().join("config/metronome.toml"))).unwrap();
    let toml::Value::Table(top) = &config else {
        panic!("config/metronome.toml is not a table")
    };
    let mut missing = Vec::new();
    for document in documents() {
        let text = read(&document);
        for (n, line) in prose_lines(&text) {
            for span in code_spans(line) {
                let key = span.split(" = ").next().unwrap().trim();
                let key = key.trim_start_matches('[').trim_end_matches(']');
                let parts: Vec<&str> = key.split('.').collect();
                let is_key = parts.len() >= 2
                    && parts.iter().all(|p| {
                        !p.is_empty()
                            && p.chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    });
                // A file name (`tls.rs`, `metrics.proto`) is not a key.
                let last = parts[parts.len() - 1];
                let file = EXTENSIONS.contains(&last) || last == "proto";
                if !is_key || file || !top.contains_key(parts[0]) || NOT_KEYS.contains(&key) {
                    continue;
                }
                if !has_key(&config, &parts) {
                    missing.push(format!(
                        "{}:{n} names `{key}`, which config/metronome.toml does not have",
                        relative(&document)
                    ));
                }
            }
        }
    }
    missing
}

#[test]
fn every_config_key_the_documents_name_is_in_the_example_config() {
    assert_none(missing_keys());
}

// === links ===

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as
/// `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let plain = heading.replace('`', "");
        let base = slug(&plain);
        let count = seen.entry(base.clone()).or_insert(0);
        found.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    found
}

/// The targets of a line's Markdown links, `[text](target)`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(after[..end].split_whitespace().next().unwrap_or(""));
        rest = &after[end..];
    }
    targets
}

/// Every relative link of the documents that does not resolve, file or heading.
fn broken_links() -> Vec<String> {
    let mut broken = Vec::new();
    for document in documents() {
        let text = read(&document);
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor)),
                    None => (target, None),
                };
                let path = if file.is_empty() {
                    document.clone()
                } else {
                    document.parent().unwrap().join(file)
                };
                let at = format!("{}:{n}", relative(&document));
                if !path.exists() {
                    broken.push(format!("{at} links to {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if path.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&path)).contains(anchor)
                {
                    broken.push(format!(
                        "{at} links to {target}: {} has no heading with that anchor",
                        relative(&path)
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_resolves_down_to_its_heading() {
    assert_none(broken_links());
}

#[test]
fn anchors_are_read_as_github_makes_them() {
    let text = "# Metrics: the contract\n## 3. Definitions\n## The files\n## The files\n```\n# not a heading\n```\n### `http1/` (roles)\n";
    let found = anchors(text);
    for anchor in [
        "metrics-the-contract",
        "3-definitions",
        "the-files",
        "the-files-1",
        "http1-roles",
    ] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        link_targets("see [a](b.md#c) and [d](https://e) (f)"),
        vec!["b.md#c", "https://e"]
    );
}
