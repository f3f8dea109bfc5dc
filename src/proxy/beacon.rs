//! The browser beacon: what a page saw of a stream, recorded under `point="client"`.
//!
//! The beacon module (assets/metronome-beacon.js) measures each token event's arrival in the
//! page and posts one compact summary per stream to the proxy listener. metronome answers it
//! itself and never forwards it. It accepts a beacon only for a stream it served recently, with
//! the key that only the stream's own client received (`x-metronome-beacon-key`, never published
//! in `/streams` or exemplars, unlike the stream ID), once per stream, within a size cap, and
//! only when its content is plausible against what metronome saw of the stream: no more gaps
//! than token events, and a TTFT plus gaps no longer than the stream lasted plus
//! `timeline.beacon_margin`. Everything else is refused with a 4xx and counted by reason, and a
//! refused beacon never takes the stream's one place, so a flood of beacons grows neither memory
//! nor series and a forger cannot crowd out the owner. A beacon takes a place under
//! `limits.max_requests` while it is answered; beyond it, it gets 503 and is counted too.

use std::time::Duration;

use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;

use super::body::{ClientBody, ProxyBody};
use super::ProxyState;
use crate::format::PhaseMix;
use crate::metering::clock::Tick;
use crate::metering::ledger::PointLedger;
use crate::metrics::Point;
use crate::timeline::{BeaconClaim, BeaconKey};

/// The response header that carries a metered stream's beacon key. A `HeaderName`, not a `&str`:
/// inserting a `&str` parses the name on every response (about 700 instructions per stream).
pub const KEY_HEADER: HeaderName = HeaderName::from_static("x-metronome-beacon-key");

/// The most gaps one beacon may carry.
pub const MAX_GAPS: usize = 2048;
/// The longest time a beacon may report, in milliseconds (an hour).
const MAX_MS: f64 = 3_600_000.0;

/// A beacon as the page sends it (docs/timelines.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Beacon {
    /// Format version; 1.
    pub v: u32,
    /// The stream ID from the response header.
    pub id: String,
    /// From the fetch call to the first token event, in ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Gaps between consecutive token events, in ms, in order.
    #[serde(default)]
    pub gaps_ms: Vec<f64>,
    /// The stream's beacon key (32 hex digits) from the response's `x-metronome-beacon-key`.
    #[serde(default)]
    pub key: Option<String>,
}

/// A key as the response header writes it: 32 lowercase hex digits.
pub fn key_text(key: BeaconKey) -> String {
    crate::hex::u128_text(key.0)
}

/// Reads a key written by [`key_text`]; `None` for anything else. Public so that the fuzzer
/// reaches it.
pub fn read_key(text: &str) -> Option<BeaconKey> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(text, 16).ok().map(BeaconKey)
}

/// Parses and checks a beacon body: JSON of version 1, at most [`MAX_GAPS`] gaps, every time
/// finite and between 0 and an hour. Public so that the fuzzer reaches it.
pub fn parse(body: &[u8]) -> Result<Beacon, String> {
    let beacon: Beacon = serde_json::from_slice(body).map_err(|e| format!("not a beacon: {e}"))?;
    validate(&beacon)?;
    Ok(beacon)
}

/// Why a beacon was not recorded: the `result` label and the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    UnknownStream,
    Duplicate,
    Malformed,
    TooLarge,
    Overloaded,
    NoKey,
    WrongKey,
    Unfinished,
    TooManyGaps,
    TooLong,
}

// === impl Refusal ===

impl Refusal {
    fn result(self) -> &'static str {
        match self {
            Refusal::UnknownStream => "unknown_stream",
            Refusal::Duplicate => "duplicate",
            Refusal::Malformed => "malformed",
            Refusal::TooLarge => "too_large",
            Refusal::Overloaded => "overloaded",
            Refusal::NoKey => "no_key",
            Refusal::WrongKey => "wrong_key",
            Refusal::Unfinished => "unfinished",
            Refusal::TooManyGaps => "too_many_gaps",
            Refusal::TooLong => "too_long",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::NoKey | Refusal::WrongKey => StatusCode::FORBIDDEN,
            Refusal::Unfinished => StatusCode::CONFLICT,
            Refusal::TooManyGaps | Refusal::TooLong => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Answers a request to the beacon path.
pub async fn answer(request: Request<ClientBody>, state: &ProxyState) -> Response<ProxyBody> {
    let outcome = accept(request, state).await;
    respond(outcome, state)
}

/// Answers a beacon that found `limits.max_requests` requests in flight: 503, counted as
/// `result="overloaded"`, its body never read.
pub fn overloaded(state: &ProxyState) -> Response<ProxyBody> {
    let message = "metronome has too many requests in flight".to_string();
    respond(Err((Refusal::Overloaded, message)), state)
}

/// Counts a beacon's outcome and answers it: 204, or the refusal as a JSON error.
fn respond(outcome: Result<(), (Refusal, String)>, state: &ProxyState) -> Response<ProxyBody> {
    let result = match &outcome {
        Ok(()) => "accepted",
        Err((refusal, _)) => refusal.result(),
    };
    state.metrics.beacons.with_label_values(&[result]).inc();
    match outcome {
        Ok(()) => {
            let mut response = Response::new(ProxyBody::local(""));
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Err((refusal, message)) => {
            let body = serde_json::json!({"error": {"type": refusal.result(), "message": message}});
            let mut response = Response::new(ProxyBody::local(body.to_string()));
            *response.status_mut() = refusal.status();
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            response
        }
    }
}

async fn accept(request: Request<ClientBody>, state: &ProxyState) -> Result<(), (Refusal, String)> {
    if request.method() != Method::POST {
        return Err((Refusal::Malformed, "a beacon is a POST".into()));
    }
    let cap = state.config.timeline.beacon_max_bytes;
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err((
            Refusal::TooLarge,
            format!("a beacon is at most {cap} bytes"),
        ));
    }
    let body = match Limited::new(request.into_body(), cap).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err((
                Refusal::TooLarge,
                format!("a beacon is at most {cap} bytes"),
            ))
        }
        Err(e) => return Err((Refusal::Malformed, format!("could not read the body: {e}"))),
    };
    let beacon = parse(&body).map_err(|m| (Refusal::Malformed, m))?;
    let key = beacon
        .key
        .as_deref()
        .map(|k| read_key(k).unwrap_or(BeaconKey(0)));
    let refused = |claim| match claim {
        BeaconClaim::Unknown => (
            Refusal::UnknownStream,
            "no recent stream has this ID".to_string(),
        ),
        BeaconClaim::Duplicate => (
            Refusal::Duplicate,
            "this stream has sent its beacon".to_string(),
        ),
        BeaconClaim::NoKey => (
            Refusal::NoKey,
            "a beacon carries its stream's key (x-metronome-beacon-key)".to_string(),
        ),
        BeaconClaim::WrongKey => (
            Refusal::WrongKey,
            "this is not the stream's key".to_string(),
        ),
    };
    let slot = state
        .registry
        .beacon_slot(&beacon.id, key)
        .map_err(refused)?;
    plausible(&beacon, slot.seen, state.config.timeline.beacon_margin)?;
    let slot = state.registry.claim_beacon(&beacon.id).map_err(refused)?;
    let model = slot
        .model
        .unwrap_or_else(|| state.metrics.models.resolve(None));
    record(&beacon, state, &slot.route, &model);
    Ok(())
}

/// Holds a beacon against what metronome saw of its stream: it may report no more gaps than
/// the stream's token events allow, and no TTFT plus gaps longer than the stream lasted plus
/// `margin`.
fn plausible(
    beacon: &Beacon,
    seen: Option<crate::timeline::BeaconSeen>,
    margin: Duration,
) -> Result<(), (Refusal, String)> {
    let Some(seen) = seen else {
        return Err((
            Refusal::Unfinished,
            "the stream has not been recorded yet; send the beacon after it ends".into(),
        ));
    };
    let allowed = seen.token_events.saturating_sub(1);
    if beacon.gaps_ms.len() as u64 > allowed {
        return Err((
            Refusal::TooManyGaps,
            format!(
                "{} gaps for a stream of {} token events",
                beacon.gaps_ms.len(),
                seen.token_events
            ),
        ));
    }
    let reported_ms = beacon.ttft_ms.unwrap_or(0.0) + beacon.gaps_ms.iter().sum::<f64>();
    let limit_ms = seen.duration_us as f64 / 1e3 + margin.as_secs_f64() * 1e3;
    if reported_ms > limit_ms {
        return Err((
            Refusal::TooLong,
            format!(
                "{reported_ms:.0} ms reported for a stream of {limit_ms:.0} ms with the margin"
            ),
        ));
    }
    Ok(())
}

fn validate(beacon: &Beacon) -> Result<(), String> {
    if beacon.v != 1 {
        return Err(format!("version {} is not understood (1 is)", beacon.v));
    }
    if beacon.gaps_ms.len() > MAX_GAPS {
        return Err(format!("at most {MAX_GAPS} gaps"));
    }
    let ok = |ms: f64| ms.is_finite() && (0.0..=MAX_MS).contains(&ms);
    if !beacon.ttft_ms.is_none_or(ok) || !beacon.gaps_ms.iter().all(|g| ok(*g)) {
        return Err("times must be between 0 and 3600000 ms".into());
    }
    Ok(())
}

/// Records the page's view through the same ledger as the other points: the token events'
/// arrival times are rebuilt from the TTFT and the gaps.
fn record(beacon: &Beacon, state: &ProxyState, route: &str, model: &str) {
    let metrics = &state.metrics;
    let start = Tick::now();
    let mut at = start.saturating_add(Duration::from_secs_f64(beacon.ttft_ms.unwrap_or(0.0) / 1e3));
    let mut point = PointLedger::default();
    point.token_events(at, 1, PhaseMix::ALL_CONTENT, metrics);
    for gap in &beacon.gaps_ms {
        at = at.saturating_add(Duration::from_secs_f64(gap / 1e3));
        point.token_events(at, 1, PhaseMix::ALL_CONTENT, metrics);
    }
    // Without a TTFT the first event's time is unknown: its gaps count, its TTFT does not.
    point.record(
        &crate::metering::ledger::Target {
            metrics,
            series: &metrics.stream_series.get(route, model),
            received: start,
            with_ttft: beacon.ttft_ms.is_some(),
            stream: crate::metrics::Exemplar {
                stream_id: &beacon.id,
                trace_id: None,
                value: 0.0,
            },
        },
        Point::Client,
    );
}
