//! OTLP's two wire protocols on the hyper client already in the tree (rustls for https), so no
//! second HTTP stack is built in:
//! - `http/protobuf`: one POST of the encoded request to `{endpoint}/v1/{signal}`, over HTTP/1.1;
//! - `grpc`: the collector service's unary `Export` call, over HTTP/2 (prior knowledge on
//!   `http://`, ALPN on `https://`): the request framed as one gRPC message (a flag byte, a
//!   32-bit length, the protobuf), and the outcome read from the `grpc-status` trailer (or from
//!   the headers of a trailers-only answer).
//!
//! The receiver's answer is bounded in time (`otlp.timeout` covers the whole exchange, body
//! included) and in bytes ([`MAX_REPLY_BYTES`]): a receiver that answers with an endless body
//! fails the export at the bound instead of growing the process's memory.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::otlp::{OtlpConfig, Protocol};

/// Why an export did not reach the receiver.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// No answer within `otlp.timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed (refused, reset, TLS).
    #[error("cannot send: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
    /// The receiver's answer body went past [`MAX_REPLY_BYTES`].
    #[error("the receiver's answer is longer than {0} bytes")]
    ReplyTooLarge(usize),
    /// The receiver answered with a status other than 2xx.
    #[error("the receiver answered {0}")]
    Status(StatusCode),
    /// A gRPC receiver answered with a `grpc-status` other than 0 (OK), or with none.
    #[error("the receiver answered grpc-status {code}: {message}")]
    Grpc {
        /// The gRPC status code (`None`: the answer carried no `grpc-status`).
        code: GrpcCode,
        /// The `grpc-message`, percent-decoding left undone (it is only logged).
        message: String,
    },
    /// The request could not be built (a header the config validation let through).
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
}

/// A gRPC status code as the answer carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    /// The numeric code (`14` is UNAVAILABLE, `8` RESOURCE_EXHAUSTED, ...).
    Code(u32),
    /// No `grpc-status` in the trailers nor in the headers.
    Missing,
}

impl std::fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcCode::Code(code) => write!(f, "{code}"),
            GrpcCode::Missing => f.write_str("(none)"),
        }
    }
}

/// What is exported: each has its HTTP path and its gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `ExportMetricsServiceRequest`.
    Metrics,
    /// `ExportTraceServiceRequest`.
    Traces,
}

// === impl Signal ===

impl Signal {
    /// The path an export of this signal is sent to under `protocol`.
    pub fn path(self, protocol: Protocol) -> &'static str {
        match (protocol, self) {
            (Protocol::HttpProtobuf, Signal::Metrics) => "/v1/metrics",
            (Protocol::HttpProtobuf, Signal::Traces) => "/v1/traces",
            (Protocol::Grpc, Signal::Metrics) => {
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
            }
            (Protocol::Grpc, Signal::Traces) => {
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            }
        }
    }
}

/// The longest answer body read from a receiver. An OTLP answer is an `Export*ServiceResponse`
/// (a partial-success count and message) or an error status: bytes to a few kilobytes.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Sends encoded export requests to the receiver in the configured protocol.
#[derive(Debug, Clone)]
pub struct Transport {
    client: Client<Connector, Full<Bytes>>,
    protocol: Protocol,
    endpoint: String,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
}

// === impl Transport ===

impl Transport {
    /// A transport for `config`, verifying https receivers against `tls`.
    pub fn new(config: &OtlpConfig, tls: rustls::ClientConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.timeout));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match config.protocol {
            Protocol::HttpProtobuf => connector.enable_http1().wrap_connector(http),
            Protocol::Grpc => connector.enable_http2().wrap_connector(http),
        };
        let mut client = Client::builder(TokioExecutor::new());
        client.pool_idle_timeout(Duration::from_secs(30));
        if config.protocol == Protocol::Grpc {
            client.http2_only(true);
        }
        Transport {
            client: client.build(connector),
            protocol: config.protocol,
            endpoint: config.endpoint.clone(),
            headers: config.headers.clone(),
            timeout: config.timeout,
        }
    }

    /// Sends `body` (an encoded `Export*ServiceRequest`) as an export of `signal` and reads the
    /// answer to its end.
    pub async fn send(&self, signal: Signal, body: Vec<u8>) -> Result<(), ExportError> {
        let uri = format!("{}{}", self.endpoint, signal.path(self.protocol));
        let mut request = Request::post(uri).header(
            header::USER_AGENT,
            concat!("metronome/", env!("CARGO_PKG_VERSION")),
        );
        let body = match self.protocol {
            Protocol::HttpProtobuf => {
                request = request.header(header::CONTENT_TYPE, "application/x-protobuf");
                Bytes::from(body)
            }
            Protocol::Grpc => {
                request = request
                    .header(header::CONTENT_TYPE, "application/grpc")
                    .header(header::TE, "trailers")
                    .header("grpc-timeout", grpc_timeout(self.timeout));
                grpc_frame(&body)
            }
        };
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body))?;
        let answer = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            // Read the body to its end so the connection can be used again; a gRPC answer's
            // outcome is in the trailers that end it. Past the bound the body is dropped, which
            // closes the connection.
            let trailers = match Limited::new(body, MAX_REPLY_BYTES).collect().await {
                Ok(collected) => collected.trailers().cloned(),
                Err(e) if e.is::<LengthLimitError>() => {
                    return Err(ExportError::ReplyTooLarge(MAX_REPLY_BYTES))
                }
                Err(_) => None,
            };
            if !parts.status.is_success() {
                return Err(ExportError::Status(parts.status));
            }
            match self.protocol {
                Protocol::HttpProtobuf => Ok(()),
                Protocol::Grpc => grpc_outcome(&parts.headers, trailers.as_ref()),
            }
        };
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(result) => result,
            Err(_) => Err(ExportError::Timeout(self.timeout)),
        }
    }
}

/// One gRPC length-prefixed message: not compressed (0), the length in 4 big-endian bytes, the
/// message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

/// `grpc-timeout` for `timeout`: at most 8 digits, in milliseconds (or seconds beyond that).
fn grpc_timeout(timeout: Duration) -> String {
    let ms = timeout.as_millis().max(1);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", timeout.as_secs().min(99_999_999))
    }
}

/// The outcome of a gRPC call: `grpc-status` from the trailers, or from the headers of a
/// trailers-only answer (how a server refuses before sending a message).
fn grpc_outcome(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Result<(), ExportError> {
    let carrying = trailers
        .filter(|t| t.contains_key("grpc-status"))
        .unwrap_or(headers);
    let code = match carrying
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        Some(0) => return Ok(()),
        Some(code) => GrpcCode::Code(code),
        None => GrpcCode::Missing,
    };
    let message = carrying
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    Err(ExportError::Grpc { code, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_message_is_a_flag_a_big_endian_length_and_the_bytes() {
        assert_eq!(&grpc_frame(b"abc")[..], b"\x00\x00\x00\x00\x03abc");
        assert_eq!(&grpc_frame(b"")[..], b"\x00\x00\x00\x00\x00");
    }

    #[test]
    fn the_grpc_timeout_has_at_most_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_secs(10)), "10000m");
        assert_eq!(grpc_timeout(Duration::from_micros(10)), "1m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
    }

    #[test]
    fn the_status_comes_from_the_trailers_or_a_trailers_only_answer() {
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", "0".parse().unwrap());
        let mut unavailable = HeaderMap::new();
        unavailable.insert("grpc-status", "14".parse().unwrap());
        unavailable.insert("grpc-message", "busy".parse().unwrap());
        let none = HeaderMap::new();
        assert!(grpc_outcome(&none, Some(&ok)).is_ok());
        assert!(grpc_outcome(&ok, None).is_ok());
        match grpc_outcome(&none, Some(&unavailable)) {
            Err(ExportError::Grpc { code, message }) => {
                assert_eq!((code, message.as_str()), (GrpcCode::Code(14), "busy"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            grpc_outcome(&unavailable, Some(&none)),
            Err(ExportError::Grpc {
                code: GrpcCode::Code(14),
                ..
            })
        ));
        assert!(matches!(
            grpc_outcome(&none, None),
            Err(ExportError::Grpc {
                code: GrpcCode::Missing,
                ..
            })
        ));
    }

    #[test]
    fn each_signal_has_its_http_path_and_its_grpc_method() {
        assert_eq!(Signal::Traces.path(Protocol::HttpProtobuf), "/v1/traces");
        assert_eq!(
            Signal::Metrics.path(Protocol::Grpc),
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
        );
    }
}
