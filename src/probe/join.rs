//! `metronome probe --join ADMIN_URL`: after the run, fetch each stream's timeline from
//! metronome's admin listener (`GET /streams/{id}`, docs/timelines.md) and split the client's
//! gaps into generation, metronome and after-metronome ([`super::attribution`] has the math).
//!
//! A stream that cannot be joined (no ID, 404, any fetch error) is counted with its reason and
//! never fails the run. Fetches are bounded: [`FETCH_CONCURRENCY`] at a time, each within
//! [`FETCH_TIMEOUT`], bodies up to [`MAX_TIMELINE_BYTES`], and one retry pass for 404s, since a
//! stream's timeline may land in the ring a moment after the client saw its last byte.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::attribution::{Attribution, AttributionBuilder, GapRow, Unjoined};
use super::client::ProbeRun;
use crate::timeline_json::StreamTimeline;

/// Timelines fetched at once: enough to finish thousands of streams in seconds, few enough not
/// to load the admin listener.
pub const FETCH_CONCURRENCY: usize = 8;

/// How long one fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest timeline body read (a full ring entry of 1024 frames is about 100 KiB).
pub const MAX_TIMELINE_BYTES: usize = 8 * 1024 * 1024;

/// How long to wait before asking again for timelines that were not found.
const RETRY_AFTER: Duration = Duration::from_millis(250);

/// The admin listener's base URL, checked before the run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    /// `http://host:port` plus any path prefix, without a trailing slash.
    base: String,
}

/// `--join` is not a URL the probe can fetch from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--join `{url}` is not an admin URL: {reason} (write e.g. http://127.0.0.1:9464)")]
pub struct AdminUrlError {
    /// What the user wrote.
    pub url: String,
    /// Why it is refused.
    pub reason: &'static str,
}

/// What fetching one stream's timeline gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetched {
    /// The timeline.
    Timeline(Box<StreamTimeline>),
    /// The stream could not be joined, and why.
    Unjoined(Unjoined),
}

// === impl AdminUrl ===

impl AdminUrl {
    /// Parses `--join`: an `http://` URL with a host, optionally with a path prefix (for an admin
    /// listener behind a path-routing gateway), without a query.
    pub fn parse(text: &str) -> Result<Self, AdminUrlError> {
        let error = |reason| AdminUrlError {
            url: text.to_owned(),
            reason,
        };
        let uri: Uri = text.parse().map_err(|_| error("it does not parse"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(error("only http:// is supported")),
            None => return Err(error("it has no scheme")),
        }
        if uri.host().is_none() {
            return Err(error("it has no host"));
        }
        if uri.query().is_some() {
            return Err(error("it has a query"));
        }
        Ok(AdminUrl {
            base: text.trim_end_matches('/').to_owned(),
        })
    }

    /// The URL of one stream's timeline; `None` for an ID that is not URL-safe (the proxy's IDs
    /// are hex, so anything else did not come from it).
    pub fn stream_url(&self, id: &str) -> Option<Uri> {
        let safe = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
        if !safe {
            return None;
        }
        format!("{}/streams/{id}", self.base).parse().ok()
    }

    /// The base URL as given (without a trailing slash).
    pub fn as_str(&self) -> &str {
        &self.base
    }
}

/// Fetches every stream's timeline and attributes the run's gaps.
pub async fn attribute_run(admin: &AdminUrl, run: &ProbeRun) -> Attribution {
    attribute(admin, run, AttributionBuilder::new(admin.as_str()))
        .await
        .0
}

/// [`attribute_run`], also returning every matched gap as a row (`probe --gaps-csv`), timed
/// from the run's start.
pub async fn attribute_run_with_rows(
    admin: &AdminUrl,
    run: &ProbeRun,
) -> (Attribution, Vec<GapRow>) {
    let builder = AttributionBuilder::new(admin.as_str()).keeping_rows(run.started);
    attribute(admin, run, builder).await
}

/// [`attribute_run`] with the run's own stall threshold (`--stall-threshold`) for the stall
/// split, and the rows too when `rows` (`probe --gaps-csv`).
pub async fn attribute_run_judged(
    admin: &AdminUrl,
    run: &ProbeRun,
    stall_threshold: std::time::Duration,
    rows: bool,
) -> (Attribution, Vec<GapRow>) {
    let mut builder = AttributionBuilder::new(admin.as_str()).stall_threshold(stall_threshold);
    if rows {
        builder = builder.keeping_rows(run.started);
    }
    attribute(admin, run, builder).await
}

async fn attribute(
    admin: &AdminUrl,
    run: &ProbeRun,
    mut builder: AttributionBuilder,
) -> (Attribution, Vec<GapRow>) {
    let ids: Vec<Option<&str>> = run.streams.iter().map(|s| s.stream_id.as_deref()).collect();
    let fetched = fetch_all(admin, &ids).await;
    for (record, fetched) in run.streams.iter().zip(fetched) {
        match fetched {
            Fetched::Timeline(timeline) => builder.joined(record, &timeline),
            Fetched::Unjoined(why) => builder.not_joined(why),
        }
    }
    let rows = builder.take_rows();
    (builder.finish(), rows)
}

/// Fetches the timelines of `ids` (in order; `None` is a stream without an ID), then once more
/// those that were not found.
pub async fn fetch_all(admin: &AdminUrl, ids: &[Option<&str>]) -> Vec<Fetched> {
    let client = client();
    let mut fetched = fetch_each(&client, admin, ids.iter().copied()).await;
    let missing: Vec<usize> = fetched
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f, Fetched::Unjoined(Unjoined::NotFound(_))))
        .map(|(i, _)| i)
        .collect();
    if !missing.is_empty() {
        tokio::time::sleep(RETRY_AFTER).await;
        let again = fetch_each(&client, admin, missing.iter().map(|i| ids[*i])).await;
        for (i, f) in missing.into_iter().zip(again) {
            fetched[i] = f;
        }
    }
    fetched
}

type AdminClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> AdminClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(FETCH_TIMEOUT));
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn fetch_each<'a>(
    client: &AdminClient,
    admin: &AdminUrl,
    ids: impl Iterator<Item = Option<&'a str>>,
) -> Vec<Fetched> {
    stream::iter(ids)
        .map(|id| fetch_one(client, admin, id))
        .buffered(FETCH_CONCURRENCY)
        .collect()
        .await
}

async fn fetch_one(client: &AdminClient, admin: &AdminUrl, id: Option<&str>) -> Fetched {
    let Some(id) = id else {
        return Fetched::Unjoined(Unjoined::NoStreamId);
    };
    let Some(url) = admin.stream_url(id) else {
        return failed(format!("stream ID `{id}` is not URL-safe"));
    };
    match tokio::time::timeout(FETCH_TIMEOUT, fetch_timeline(client, &url)).await {
        Ok(Ok(timeline)) if timeline.id == id => Fetched::Timeline(Box::new(timeline)),
        Ok(Ok(timeline)) => failed(format!(
            "GET {url} answered with the timeline of another stream ({})",
            timeline.id
        )),
        Ok(Err(FetchError::NotFound)) => Fetched::Unjoined(Unjoined::NotFound(format!(
            "GET {url}: 404, the stream is unknown or has left the ring"
        ))),
        Ok(Err(FetchError::Other(e))) => failed(format!("GET {url}: {e}")),
        Err(_) => failed(format!("GET {url}: no answer within {FETCH_TIMEOUT:?}")),
    }
}

fn failed(message: String) -> Fetched {
    Fetched::Unjoined(Unjoined::FetchError(message))
}

/// Why one fetch failed.
enum FetchError {
    /// 404.
    NotFound,
    /// Anything else, as a sentence.
    Other(String),
}

async fn fetch_timeline(client: &AdminClient, url: &Uri) -> Result<StreamTimeline, FetchError> {
    let request = Request::get(url.clone())
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::new())
        .map_err(|e| FetchError::Other(e.to_string()))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| FetchError::Other(crate::error::Chain(&e).to_string()))?;
    match response.status() {
        StatusCode::OK => {}
        StatusCode::NOT_FOUND => return Err(FetchError::NotFound),
        status => return Err(FetchError::Other(format!("status {status}"))),
    }
    let body = Limited::new(response.into_body(), MAX_TIMELINE_BYTES)
        .collect()
        .await
        .map_err(|e| FetchError::Other(format!("reading the body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| FetchError::Other(format!("not a stream timeline: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        let a = AdminUrl::parse("http://127.0.0.1:9464/").unwrap();
        assert_eq!(a.as_str(), "http://127.0.0.1:9464");
        assert_eq!(
            a.stream_url("5f3a9c1e000000000042").unwrap().to_string(),
            "http://127.0.0.1:9464/streams/5f3a9c1e000000000042"
        );
        assert_eq!(a.stream_url("../metrics"), None);
        assert_eq!(a.stream_url("a b"), None);
        assert_eq!(a.stream_url(""), None);
        let prefixed = AdminUrl::parse("http://h:1/admin").unwrap();
        assert_eq!(
            prefixed.stream_url("ab").unwrap().to_string(),
            "http://h:1/admin/streams/ab"
        );
        for bad in [
            "https://h:1",
            "127.0.0.1:9464",
            "http://h:1/?x=1",
            "nonsense url",
        ] {
            assert!(AdminUrl::parse(bad).is_err(), "{bad}");
        }
        let e = AdminUrl::parse("https://h").unwrap_err().to_string();
        assert!(
            e.starts_with("--join `https://h` is not an admin URL"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn unreachable_admin_and_missing_ids_are_counted() {
        // A port nothing listens on: bind, take the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin = AdminUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let fetched = fetch_all(&admin, &[None, Some("abc"), Some("a/b")]).await;
        assert_eq!(fetched[0], Fetched::Unjoined(Unjoined::NoStreamId));
        assert!(
            matches!(&fetched[1], Fetched::Unjoined(Unjoined::FetchError(m)) if m.contains("/streams/abc")),
            "{:?}",
            fetched[1]
        );
        assert!(
            matches!(&fetched[2], Fetched::Unjoined(Unjoined::FetchError(m)) if m.contains("not URL-safe")),
            "{:?}",
            fetched[2]
        );
    }
}
