//! Why metronome answered a request itself instead of forwarding the upstream's response: each
//! reason knows its status, its JSON error `type` and its message, so the forwarding code says
//! only which refusal it is (as `http1::server::head::HeadError::status` does for malformed heads).
//!
//! The client is told what kind of failure it was, never where the upstream is or what the
//! operating system said ([`Refusal::public_message`]); the whole error chain, upstream and OS
//! error included, goes to the log.

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};

use super::body::ProxyBody;
use super::router::Route;
use super::upstream::{UpstreamError, UpstreamFailure};
use super::ProxyState;
use crate::config::Upstream;

/// A request metronome refuses, or could not get an upstream response for.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// `limits.max_requests_in_flight` requests are already being served.
    #[error("metronome has too many requests in flight")]
    Overloaded,
    /// The request body is (or says it is) larger than `limits.max_request_body_bytes`.
    #[error("the request body is larger than {0} bytes")]
    BodyTooLarge(u64),
    /// The request head's method, target, `Host` or `Transfer-Encoding` is refused.
    #[error("{0}")]
    Form(#[from] crate::http1::request_form::FormError),
    /// The client's request body broke off or broke its framing while it was forwarded: the
    /// client's fault (400), not counted as an upstream error.
    #[error("the request body is invalid")]
    ClientBody(#[source] UpstreamError),
    /// The request's path does not make an upstream URI.
    #[error("cannot build the upstream URI: {0}")]
    UpstreamUri(#[source] http::uri::InvalidUri),
    /// The upstream could not be reached, or failed before its response head.
    #[error("upstream {upstream} failed")]
    Upstream {
        /// Where the request went.
        upstream: Arc<Upstream>,
        /// How it failed.
        #[source]
        error: UpstreamError,
    },
    /// The upstream sent no response head within `timeouts.first_byte`.
    #[error("upstream {upstream} sent no response head within {timeout:?}")]
    NoHead {
        /// Where the request went.
        upstream: Arc<Upstream>,
        /// How long metronome waited.
        timeout: Duration,
    },
}

// === impl Refusal ===

impl Refusal {
    /// A failure of the upstream client: a request body over its limit is the client's fault
    /// (413); anything else is the upstream's.
    pub fn from_upstream(error: UpstreamError, upstream: &Arc<Upstream>, limit: u64) -> Self {
        if error.body_too_large() {
            Refusal::BodyTooLarge(limit)
        } else if error.client_body_failed() {
            Refusal::ClientBody(error)
        } else {
            Refusal::Upstream {
                upstream: upstream.clone(),
                error,
            }
        }
    }

    /// The response status.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Form(form) => form.status(),
            Refusal::UpstreamUri(_) | Refusal::ClientBody(_) => StatusCode::BAD_REQUEST,
            Refusal::NoHead { .. } => StatusCode::GATEWAY_TIMEOUT,
            Refusal::Upstream { error, .. } => match error.failure() {
                UpstreamFailure::Timeout => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            },
        }
    }

    /// The JSON error body's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Overloaded => "overloaded",
            Refusal::BodyTooLarge(_) => "request_too_large",
            Refusal::UpstreamUri(_) | Refusal::Form(_) | Refusal::ClientBody(_) => {
                "invalid_request"
            }
            Refusal::NoHead { .. } => "upstream_timeout",
            Refusal::Upstream { error, .. } => match error.failure() {
                UpstreamFailure::Timeout => "upstream_timeout",
                _ => "upstream_unavailable",
            },
        }
    }

    /// The upstream failure it counts in `metronome_upstream_errors_total`, when it is one.
    pub fn upstream_failure(&self) -> Option<UpstreamFailure> {
        match self {
            Refusal::Upstream { error, .. } => Some(error.failure()),
            Refusal::NoHead { .. } => Some(UpstreamFailure::Timeout),
            _ => None,
        }
    }

    /// The JSON error's message: what kind of failure, without the upstream's address or the
    /// OS error (those are for the log, not for any client).
    pub fn public_message(&self) -> String {
        match self {
            Refusal::Overloaded | Refusal::BodyTooLarge(_) | Refusal::Form(_) => self.to_string(),
            // What broke is logged with the chain; the client is told only that its body did.
            Refusal::ClientBody(_) => "the request body is invalid".into(),
            Refusal::UpstreamUri(_) => "the request's path does not make an upstream URI".into(),
            Refusal::NoHead { timeout, .. } => {
                format!("the upstream sent no response head within {timeout:?}")
            }
            Refusal::Upstream { error, .. } => match error.failure() {
                UpstreamFailure::Connect => "the upstream could not be reached",
                UpstreamFailure::Timeout => "the upstream did not answer in time",
                UpstreamFailure::Reset => "the upstream connection closed before a response",
                UpstreamFailure::Protocol => "the upstream's response was not valid HTTP/1.1",
            }
            .into(),
        }
    }

    /// Counts the refusal and answers it as a JSON error; an upstream failure is logged with
    /// its whole chain.
    pub fn answer(self, state: &ProxyState, route: &Route) -> Response<ProxyBody> {
        if let Some(failure) = self.upstream_failure() {
            state.count_upstream_error(&route.name, failure.kind());
            tracing::warn!(route = %route.name, kind = failure.kind(), error = %crate::error::Chain(&self), "upstream request failed");
        }
        state.answer_error(
            &route.name,
            self.status(),
            self.kind(),
            &self.public_message(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::http1::client::ClientError;

    /// A native client's error of the given kind.
    fn native_error(failure: UpstreamFailure) -> UpstreamError {
        let error = match failure {
            UpstreamFailure::Connect => {
                ClientError::Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            }
            UpstreamFailure::Timeout => ClientError::ConnectTimeout(Duration::from_secs(1)),
            UpstreamFailure::Reset => ClientError::NoResponse,
            UpstreamFailure::Protocol => ClientError::HeadTooLong(1),
        };
        assert_eq!(UpstreamFailure::of_native(&error), failure);
        error.into()
    }

    #[test]
    fn each_refusal_knows_its_status_and_kind() {
        let upstream: Arc<Upstream> =
            Arc::new(Upstream::parse("http://127.0.0.1:1").expect("upstream"));
        let failed = |failure| Refusal::Upstream {
            upstream: upstream.clone(),
            error: native_error(failure),
        };
        let cases = [
            (Refusal::Overloaded, 503, "overloaded", None),
            (Refusal::BodyTooLarge(10), 413, "request_too_large", None),
            (
                failed(UpstreamFailure::Connect),
                502,
                "upstream_unavailable",
                Some(UpstreamFailure::Connect),
            ),
            (
                failed(UpstreamFailure::Timeout),
                504,
                "upstream_timeout",
                Some(UpstreamFailure::Timeout),
            ),
            (
                Refusal::NoHead {
                    upstream: upstream.clone(),
                    timeout: Duration::from_secs(1),
                },
                504,
                "upstream_timeout",
                Some(UpstreamFailure::Timeout),
            ),
        ];
        for (refusal, status, kind, failure) in cases {
            assert_eq!(refusal.status().as_u16(), status, "{refusal}");
            assert_eq!(refusal.kind(), kind, "{refusal}");
            assert_eq!(refusal.upstream_failure(), failure, "{refusal}");
        }
    }

    #[test]
    fn the_client_is_told_the_kind_of_failure_and_the_log_the_rest() {
        let upstream: Arc<Upstream> =
            Arc::new(Upstream::parse("http://10.1.2.3:8000").expect("upstream"));
        let cause = "tcp connect error: Connection refused (os error 111)";
        let refusal = Refusal::Upstream {
            upstream: upstream.clone(),
            error: ClientError::Connect(std::io::Error::from_raw_os_error(111)).into(),
        };
        assert_eq!(
            refusal.public_message(),
            "the upstream could not be reached"
        );
        let logged = crate::error::Chain(&refusal).to_string();
        assert!(
            logged.contains("10.1.2.3:8000") && logged.contains(cause),
            "{logged}"
        );
        let silent = Refusal::NoHead {
            upstream,
            timeout: Duration::from_secs(3),
        };
        assert!(!silent.public_message().contains("10.1.2.3"));
    }

    #[test]
    fn a_request_body_over_its_limit_is_the_clients_fault() {
        let upstream: Arc<Upstream> =
            Arc::new(Upstream::parse("http://127.0.0.1:1").expect("upstream"));
        let body_error: crate::http1::BoxError =
            Box::new(crate::proxy::client_body::BodyTooLarge(64));
        let error = UpstreamError::from(ClientError::RequestBody(body_error));
        let refusal = Refusal::from_upstream(error, &upstream, 64);
        assert_eq!(refusal.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            refusal.to_string(),
            "the request body is larger than 64 bytes"
        );
    }
}
