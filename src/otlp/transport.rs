//! OTLP over HTTP with protobuf bodies: one POST per export, on the hyper client already in the
//! tree (rustls for https), so no second HTTP stack is built in.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::config::OtlpConfig;

/// Why an export did not reach the receiver.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// No answer within `otlp.timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed (refused, reset, TLS).
    #[error("cannot send: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
    /// The receiver answered with a status other than 2xx.
    #[error("the receiver answered {0}")]
    Status(StatusCode),
    /// The request could not be built (a header the config validation let through).
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Sends encoded export requests to `{endpoint}/v1/{signal}`.
#[derive(Debug, Clone)]
pub struct Transport {
    client: Client<Connector, Full<Bytes>>,
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
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Transport {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            endpoint: config.endpoint.clone(),
            headers: config.headers.clone(),
            timeout: config.timeout,
        }
    }

    /// POSTs `body` (an encoded `Export*ServiceRequest`) to the `signal`'s path (`metrics`,
    /// `traces`) and reads the answer.
    pub async fn send(&self, signal: &str, body: Vec<u8>) -> Result<(), ExportError> {
        let mut request = Request::post(format!("{}/v1/{signal}", self.endpoint))
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                header::USER_AGENT,
                concat!("metronome/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(Bytes::from(body)))?;
        let answer = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            // Read the body to its end so the connection can go back to the pool.
            let _ = response.into_body().collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(ExportError::Status(status))
            }
        };
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(result) => result,
            Err(_) => Err(ExportError::Timeout(self.timeout)),
        }
    }
}
