//! Live goodput: a request may carry its own latency objectives, as llm-d's gateway sends them
//! (`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`), and metronome counts, per route and model,
//! the streams that met or missed each (`metronome_slo_streams_total{route,model,objective,
//! result}`), so that goodput is a live rate on the server and not only a figure of a probe run.
//!
//! The judgement is the one `metronome probe --slo` makes of a stream (and vllm bench serve's
//! `--goodput`): time to first token and time per output token at most the objective, both as
//! the client received them (egress); a stream that did not complete meets no objective; a stream
//! with fewer than two tokens has no time between tokens to miss.

use std::time::Duration;

use http::HeaderMap;

/// The request header with the objective for time to first token, in milliseconds.
pub const TTFT_HEADER: &str = "x-llm-d-slo-ttft-ms";
/// The request header with the objective for time per output token, in milliseconds.
pub const TPOT_HEADER: &str = "x-llm-d-slo-tpot-ms";

/// The largest objective taken from a header (one hour); anything larger is not an objective.
const MAX_OBJECTIVE_MS: u64 = 3_600_000;

/// The objectives one request carries; at least one is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSlo {
    /// Time to first token at most this.
    pub ttft: Option<Duration>,
    /// Time per output token (the first token to the last, over the tokens but one) at most this.
    pub tpot: Option<Duration>,
}

/// What the client received of a stream, as the objectives judge it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivered {
    /// The stream ended `complete`.
    pub complete: bool,
    /// Time to first token at egress, when a token reached the client.
    pub ttft: Option<Duration>,
    /// Time per output token at egress, when the stream had two tokens or more.
    pub tpot: Option<Duration>,
}

/// One judgement: which objective (`ttft`, `tpot`, or `all` of those the request set) and
/// whether the stream met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The `objective` label.
    pub objective: &'static str,
    /// `met` or `missed`, the `result` label.
    pub met: bool,
}

impl Verdict {
    /// The `result` label.
    pub fn result(self) -> &'static str {
        if self.met {
            "met"
        } else {
            "missed"
        }
    }
}

impl StreamSlo {
    /// The objectives in a request's headers, or `None` when it sets none. A value that is not
    /// a whole number of milliseconds from 1 to an hour is ignored, as if the header were absent
    /// (a malformed hint must not fail or alter the request).
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let objective = |name: &str| {
            let ms: u64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
            (1..=MAX_OBJECTIVE_MS)
                .contains(&ms)
                .then(|| Duration::from_millis(ms))
        };
        let slo = StreamSlo {
            ttft: objective(TTFT_HEADER),
            tpot: objective(TPOT_HEADER),
        };
        (slo.ttft.is_some() || slo.tpot.is_some()).then_some(slo)
    }

    /// The verdict on each objective set, then on `all` of them together.
    pub fn judge(&self, delivered: &Delivered) -> impl Iterator<Item = Verdict> {
        let ttft = self.ttft.map(|bound| Verdict {
            objective: "ttft",
            met: delivered.complete && delivered.ttft.is_some_and(|t| t <= bound),
        });
        let tpot = self.tpot.map(|bound| Verdict {
            objective: "tpot",
            met: delivered.complete && delivered.tpot.is_none_or(|t| t <= bound),
        });
        let all = Verdict {
            objective: "all",
            met: ttft.is_none_or(|v| v.met) && tpot.is_none_or(|v| v.met),
        };
        ttft.into_iter().chain(tpot).chain(std::iter::once(all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    use crate::units::ms;

    #[test]
    fn objectives_come_from_the_llm_d_headers() {
        let slo = StreamSlo::from_headers(&headers(&[(TTFT_HEADER, "500"), (TPOT_HEADER, " 50 ")]));
        assert_eq!(
            slo,
            Some(StreamSlo {
                ttft: Some(ms(500)),
                tpot: Some(ms(50))
            })
        );
        let only = StreamSlo::from_headers(&headers(&[(TPOT_HEADER, "20")])).unwrap();
        assert_eq!((only.ttft, only.tpot), (None, Some(ms(20))));
        assert_eq!(StreamSlo::from_headers(&HeaderMap::new()), None);
    }

    #[test]
    fn a_malformed_objective_is_as_if_absent() {
        for bad in [
            "",
            "0",
            "-5",
            "1.5",
            "abc",
            "3600001",
            "99999999999999999999",
        ] {
            assert_eq!(
                StreamSlo::from_headers(&headers(&[(TTFT_HEADER, bad)])),
                None,
                "{bad:?}"
            );
        }
    }

    fn verdicts(slo: StreamSlo, delivered: Delivered) -> Vec<(&'static str, bool)> {
        slo.judge(&delivered)
            .map(|v| (v.objective, v.met))
            .collect()
    }

    #[test]
    fn each_objective_is_judged_and_all_of_them_together() {
        let slo = StreamSlo {
            ttft: Some(ms(500)),
            tpot: Some(ms(50)),
        };
        let fast = Delivered {
            complete: true,
            ttft: Some(ms(500)),
            tpot: Some(ms(50)),
        };
        assert_eq!(
            verdicts(slo, fast),
            [("ttft", true), ("tpot", true), ("all", true)]
        );
        let slow_tokens = Delivered {
            tpot: Some(ms(51)),
            ..fast
        };
        assert_eq!(
            verdicts(slo, slow_tokens),
            [("ttft", true), ("tpot", false), ("all", false)]
        );
        let one_token = Delivered { tpot: None, ..fast };
        assert_eq!(
            verdicts(slo, one_token),
            [("ttft", true), ("tpot", true), ("all", true)]
        );
    }

    #[test]
    fn a_stream_that_did_not_complete_or_had_no_token_misses() {
        let slo = StreamSlo {
            ttft: Some(ms(500)),
            tpot: None,
        };
        let cut = Delivered {
            complete: false,
            ttft: Some(ms(10)),
            tpot: None,
        };
        assert_eq!(verdicts(slo, cut), [("ttft", false), ("all", false)]);
        let silent = Delivered {
            complete: true,
            ttft: None,
            tpot: None,
        };
        assert_eq!(verdicts(slo, silent), [("ttft", false), ("all", false)]);
    }
}
