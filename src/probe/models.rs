//! `--model` by default: without it, the probe asks the server's `GET /v1/models` (the
//! OpenAI-compatible list vLLM, SGLang, TGI and llama.cpp serve) and uses the first model listed,
//! so that a probe of vLLM does not 404 on a made-up model name.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};

use super::args::ProbeConfig;
use super::client::{build_client, one_line, ProbeError};

/// The list's path on the server of `--url`.
pub const MODELS_PATH: &str = "/v1/models";

/// At most this much of the list is read (a list of thousands of models is still far smaller).
const MAX_LIST_BYTES: usize = 4 << 20;

/// Why no model could be found: the run fails (exit 3), saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The client could not be set up.
    #[error(transparent)]
    Client(#[from] ProbeError),
    /// The request failed (connection refused, reset, timeout).
    #[error("GET {url} failed: {reason}")]
    Request {
        /// The list's URL.
        url: Uri,
        /// Why.
        reason: String,
    },
    /// The server answered with a non-2xx status.
    #[error("GET {url} answered {status}{}", body.as_ref().map(|b| format!(": {b}")).unwrap_or_default())]
    Status {
        /// The list's URL.
        url: Uri,
        /// The status.
        status: u16,
        /// The start of the error body.
        body: Option<String>,
    },
    /// The answer is not an OpenAI model list with at least one `id`.
    #[error("GET {url} did not list a model (expected {{\"data\":[{{\"id\":...}}]}}): {body}")]
    NoModel {
        /// The list's URL.
        url: Uri,
        /// The start of what it answered.
        body: String,
    },
}

/// The URL of the model list on `url`'s server.
pub fn models_url(url: &Uri) -> Uri {
    let mut parts = url.clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(MODELS_PATH));
    Uri::from_parts(parts).unwrap_or_else(|_| url.clone())
}

/// Asks `config`'s server for its models and returns the first one's `id`. The request carries
/// the run's headers (its `User-Agent`, the `Authorization` of `--api-key`, the user's
/// `--header`s), never a body; a credential the answer echoes is masked.
pub async fn discover_model(config: &ProbeConfig) -> Result<String, ModelError> {
    let client = build_client(config)?;
    let url = models_url(&config.url);
    let mut builder = Request::builder().method(Method::GET).uri(url.clone());
    if let Some(headers) = builder.headers_mut() {
        headers.extend(config.headers.clone());
        headers.remove(CONTENT_TYPE);
        headers.remove(CONTENT_LENGTH);
    }
    let request_error = |reason: String| ModelError::Request {
        url: url.clone(),
        reason,
    };
    let request = builder
        .body(Full::new(Bytes::new()))
        .map_err(|e| request_error(e.to_string()))?;
    let response = tokio::time::timeout(config.timeout, client.request(request))
        .await
        .map_err(|_| request_error("no answer within the timeout".to_owned()))?
        .map_err(|e| request_error(crate::error::Chain(&e).to_string()))?;
    let status = response.status();
    let body = tokio::time::timeout(
        config.timeout,
        Limited::new(response.into_body(), MAX_LIST_BYTES).collect(),
    )
    .await
    .map_err(|_| request_error("the list did not arrive within the timeout".to_owned()))?
    .map_err(|e| request_error(e.to_string()))?
    .to_bytes();
    let text = String::from_utf8_lossy(&body);
    let text = config.secrets.redact(&text);
    if !status.is_success() {
        return Err(ModelError::Status {
            url,
            status: status.as_u16(),
            body: one_line(&text, 300),
        });
    }
    first_model(&body).ok_or_else(|| ModelError::NoModel {
        url,
        body: one_line(&text, 300).unwrap_or_else(|| "an empty body".to_owned()),
    })
}

/// The first `data[].id` of an OpenAI model list.
pub fn first_model(body: &[u8]) -> Option<String> {
    let list: serde_json::Value = serde_json::from_slice(body).ok()?;
    list.get("data")?
        .as_array()?
        .iter()
        .find_map(|m| m.get("id")?.as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_listed_id_is_the_model() {
        let vllm =
            br#"{"object":"list","data":[{"id":"Qwen/Qwen2.5-0.5B","object":"model"},{"id":"b"}]}"#;
        assert_eq!(first_model(vllm).as_deref(), Some("Qwen/Qwen2.5-0.5B"));
        assert_eq!(first_model(br#"{"data":[]}"#), None);
        assert_eq!(first_model(b"not json"), None);
        assert_eq!(first_model(br#"{"data":[{"name":"x"}]}"#), None);
    }

    #[test]
    fn the_list_is_on_the_same_server() {
        let url: Uri = "https://h:8443/v1/chat/completions".parse().unwrap();
        assert_eq!(models_url(&url).to_string(), "https://h:8443/v1/models");
    }
}
