//! `[otlp]`: where and how OTLP metrics (and spans) are sent, as written and as validated.
//!
//! Part of the configuration, so a file with an `[otlp]` section is understood (and refused with a
//! reason) by a build without the `otlp` feature too.

use std::time::Duration;

use serde::Deserialize;

/// `[otlp]` as written in the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawOtlp {
    /// The receiver's base URL (`http://collector:4318`); empty turns OTLP off (the default).
    pub endpoint: String,
    /// `http/protobuf` (the default; collectors listen on 4318) or `grpc` (on 4317).
    pub protocol: String,
    /// Extra request headers, such as an API key (`{ "x-api-key" = "…" }`).
    pub headers: std::collections::BTreeMap<String, String>,
    /// How often the metrics are exported (`30s`).
    pub interval: String,
    /// How long one export may take before it counts as failed.
    pub timeout: String,
    /// `service.name` of the resource (`OTEL_SERVICE_NAME` wins when set).
    pub service_name: String,
    /// One span per stream (off by default).
    pub traces: bool,
    /// Ended streams waiting for the span exporter at most; more are dropped and counted.
    pub traces_queue: usize,
    /// Bytes those streams may hold at most; more are dropped and counted.
    pub traces_queue_bytes: usize,
}

impl Default for RawOtlp {
    fn default() -> Self {
        RawOtlp {
            endpoint: String::new(),
            protocol: "http/protobuf".into(),
            headers: Default::default(),
            interval: "30s".into(),
            timeout: "10s".into(),
            service_name: "metronome".into(),
            traces: false,
            traces_queue: 4096,
            traces_queue_bytes: 16 * 1024 * 1024,
        }
    }
}

/// The wire protocol of the exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Protobuf-encoded requests POSTed to `{endpoint}/v1/{signal}`.
    HttpProtobuf,
    /// The collector services' unary `Export` calls over HTTP/2.
    Grpc,
}

/// `[otlp]` validated: `None` in [`crate::config::Config`] when OTLP is off.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The base URL, without a trailing slash; signal paths (`/v1/metrics`) are appended.
    pub endpoint: String,
    /// The wire protocol.
    pub protocol: Protocol,
    /// Extra request headers, validated as HTTP header names and values.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Time between metric exports.
    pub interval: Duration,
    /// Deadline of one export.
    pub timeout: Duration,
    /// `service.name`.
    pub service_name: String,
    /// One span per stream.
    pub traces: bool,
    /// Capacity of the span queue, in ended streams.
    pub traces_queue: usize,
    /// Capacity of the span queue, in the bytes its streams hold.
    pub traces_queue_bytes: usize,
}

/// The smallest span queue in bytes: room for about twenty streams of 128 stalls each.
const MIN_QUEUE_BYTES: usize = 64 * 1024;
/// The largest span queue in bytes (1 GiB): more is a typo.
const MAX_QUEUE_BYTES: usize = 1 << 30;

/// Why an endpoint with user information (`http://user:secret@collector`) is refused: the
/// endpoint is written into every failed-export warning, and a password does not belong there.
const USER_INFORMATION: &str = "has user information (`user:password@`), which would be written \
     to the logs; send credentials as request headers in `[otlp] headers` \
     (e.g. `headers = { authorization = \"Basic ...\" }`)";

/// `text` with anything between `://` and an `@` before the next `/` replaced by `***`, for a
/// message that echoes an endpoint that did not even parse as a URL.
fn without_user_information(text: &str) -> String {
    let (scheme, rest) = text.split_once("://").unwrap_or(("", text));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) if scheme.is_empty() => format!("***{}", &rest[at..]),
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => text.to_string(),
    }
}

// === impl RawOtlp ===

impl RawOtlp {
    /// Validates the section: `Ok(None)` when OTLP is off, otherwise the settings or every
    /// problem as `(dotted key, reason)`.
    pub fn validate(&self) -> Result<Option<OtlpConfig>, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let endpoint = self.endpoint.trim().trim_end_matches('/').to_string();
        if endpoint.is_empty() {
            return Ok(None);
        }
        if !cfg!(feature = "otlp") {
            problems.push((
                "otlp.endpoint".into(),
                "this build has no OTLP exporter (cargo feature `otlp`)".into(),
            ));
        }
        match endpoint.parse::<http::Uri>() {
            // Checked first: a URL with credentials is never echoed, whatever else is wrong.
            Ok(uri) if uri.authority().is_some_and(|a| a.as_str().contains('@')) => {
                problems.push(("otlp.endpoint".into(), USER_INFORMATION.into()))
            }
            Ok(uri)
                if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {}
            _ => problems.push((
                "otlp.endpoint".into(),
                format!(
                    "`{}` is not an http:// or https:// URL",
                    without_user_information(&self.endpoint)
                ),
            )),
        }
        let protocol = match self.protocol.as_str() {
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            "grpc" => Some(Protocol::Grpc),
            other => {
                problems.push((
                    "otlp.protocol".into(),
                    format!("`{other}` is not one of http/protobuf, grpc"),
                ));
                None
            }
        };
        let mut headers = Vec::new();
        for (name, value) in &self.headers {
            match (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                (Ok(n), Ok(v)) => headers.push((n, v)),
                _ => problems.push((
                    format!("otlp.headers.{name}"),
                    "is not a valid HTTP header name and value".into(),
                )),
            }
        }
        if !(1..=1_000_000).contains(&self.traces_queue) {
            problems.push((
                "otlp.traces_queue".into(),
                format!("{} is out of range (1 to 1000000)", self.traces_queue),
            ));
        }
        if !(MIN_QUEUE_BYTES..=MAX_QUEUE_BYTES).contains(&self.traces_queue_bytes) {
            problems.push((
                "otlp.traces_queue_bytes".into(),
                format!(
                    "{} is out of range ({MIN_QUEUE_BYTES} to {MAX_QUEUE_BYTES})",
                    self.traces_queue_bytes
                ),
            ));
        }
        let mut duration = |key: &str, text: &str| match crate::units::parse_duration(text) {
            Ok(d) if !d.is_zero() && d <= Duration::from_secs(24 * 3600) => Some(d),
            Ok(_) => {
                problems.push((key.into(), format!("`{text}` must be between 0 and 24h")));
                None
            }
            Err(e) => {
                problems.push((key.into(), e));
                None
            }
        };
        let interval = duration("otlp.interval", &self.interval);
        let timeout = duration("otlp.timeout", &self.timeout);
        match (protocol, interval, timeout) {
            (Some(protocol), Some(interval), Some(timeout)) if problems.is_empty() => {
                Ok(Some(OtlpConfig {
                    endpoint,
                    protocol,
                    headers,
                    interval,
                    timeout,
                    service_name: self.service_name.clone(),
                    traces: self.traces,
                    traces_queue: self.traces_queue,
                    traces_queue_bytes: self.traces_queue_bytes,
                }))
            }
            _ => Err(problems),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_an_endpoint_is_given() {
        assert_eq!(RawOtlp::default().validate(), Ok(None));
    }

    #[test]
    fn a_full_section_validates() {
        let raw = RawOtlp {
            endpoint: "http://127.0.0.1:4318/".into(),
            headers: [("x-api-key".to_string(), "k".to_string())].into(),
            interval: "2s".into(),
            ..RawOtlp::default()
        };
        let config = raw.validate().unwrap().unwrap();
        assert_eq!(config.endpoint, "http://127.0.0.1:4318");
        assert_eq!(config.interval, Duration::from_secs(2));
        assert_eq!(config.headers.len(), 1);
    }

    #[test]
    fn an_endpoint_with_user_information_is_refused_without_echoing_it() {
        for endpoint in [
            "http://user:s3cret@collector:4318",
            "https://s3cret@collector",
            "ftp://user:s3cret@collector",
            "http://user:s3cret@[bad/v1",
        ] {
            let raw = RawOtlp {
                endpoint: endpoint.into(),
                ..RawOtlp::default()
            };
            let problems = raw.validate().unwrap_err();
            assert_eq!(problems.len(), 1, "{endpoint}: {problems:?}");
            assert_eq!(problems[0].0, "otlp.endpoint");
            assert!(
                !problems[0].1.contains("s3cret"),
                "{endpoint}: {problems:?}"
            );
        }
        let raw = RawOtlp {
            endpoint: "http://user:s3cret@collector:4318".into(),
            ..RawOtlp::default()
        };
        assert!(raw.validate().unwrap_err()[0].1.contains("[otlp] headers"));
    }

    #[test]
    fn every_problem_is_named_by_its_key() {
        let raw = RawOtlp {
            endpoint: "ftp://x".into(),
            protocol: "thrift".into(),
            headers: [("bad name".to_string(), "v".to_string())].into(),
            interval: "0s".into(),
            ..RawOtlp::default()
        };
        let keys: Vec<String> = raw
            .validate()
            .unwrap_err()
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(
            keys,
            [
                "otlp.endpoint",
                "otlp.protocol",
                "otlp.headers.bad name",
                "otlp.interval"
            ]
        );
    }
}
