//! Goodput: `--slo 'ttft<500ms,tpot<=50ms,itl_p99<100ms,stalls==0'` judges every stream against
//! every objective, and `goodput` is the share of streams that met them all.
//!
//! The per-stream figures follow vllm bench serve's `--goodput`, so the two tools agree on the
//! same requests: `ttft` from the start, `e2el` from the start to the end of the body, and
//! `tpot = (e2el - ttft) / (output tokens - 1)`, taken as 0 for a stream of one token. vLLM
//! counts a request good when `slo >= value` for each objective, which is `ttft<=500ms` here; it
//! reports good requests per second of the run, here `goodput_rps`. A failed stream meets no
//! objective (vLLM leaves failed requests out of its good count too).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use super::compare::Cmp;
use super::stats::nearest_rank;
use super::stream::StreamRecord;
use crate::units::parse_duration;

/// What an objective measures, per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Time to first token, from the intended start.
    Ttft,
    /// Time per output token after the first: (e2el - ttft) / (output tokens - 1).
    Tpot,
    /// End-to-end latency: intended start to the end of the body.
    E2el,
    /// The stream's own p99 gap (0 with fewer than two token events).
    ItlP99,
    /// The stream's longest gap (0 with fewer than two token events).
    ItlMax,
    /// The stream's gaps over the stall threshold (a count).
    Stalls,
}

/// Every objective with its name.
const OBJECTIVES: [(&str, Objective); 6] = [
    ("ttft", Objective::Ttft),
    ("tpot", Objective::Tpot),
    ("e2el", Objective::E2el),
    ("itl_p99", Objective::ItlP99),
    ("itl_max", Objective::ItlMax),
    ("stalls", Objective::Stalls),
];

/// One objective of `--slo`.
#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    /// What is measured.
    pub objective: Objective,
    /// How it is compared.
    pub cmp: Cmp,
    /// The bound: milliseconds for latencies, a count for stalls.
    pub bound: f64,
    /// As written (without spaces).
    pub text: String,
}

/// An `--slo` that cannot be parsed: a usage error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SloError {
    /// No comparison.
    #[error("objective `{0}` has no comparison (write e.g. `ttft<500ms`; < <= > >= ==)")]
    NoOperator(String),
    /// Not an objective.
    #[error("objective `{gate}` measures `{name}`, which is not an objective (known: ttft, tpot, e2el, itl_p99, itl_max, stalls)")]
    Unknown {
        /// The whole objective.
        gate: String,
        /// The unknown name.
        name: String,
    },
    /// A bad bound.
    #[error("objective `{0}` needs a duration with a unit (or, for stalls, a whole number)")]
    BadBound(String),
    /// `--slo` with no objective.
    #[error("--slo names no objective")]
    Empty,
}

/// The per-stream figures an objective is judged on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamFigures {
    /// TTFT in ms.
    pub ttft_ms: f64,
    /// TPOT in ms (0 for one output token).
    pub tpot_ms: f64,
    /// End-to-end latency in ms.
    pub e2el_ms: f64,
    /// The stream's p99 gap in ms.
    pub itl_p99_ms: f64,
    /// The stream's longest gap in ms.
    pub itl_max_ms: f64,
    /// Gaps over the stall threshold.
    pub stalls: f64,
}

/// Goodput of a run: the JSON `goodput` section.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Goodput {
    /// The objectives, as given.
    pub slo: String,
    /// Streams that met every objective.
    pub good: u64,
    /// Streams judged (every stream started).
    pub streams: u64,
    /// good / streams (`null` for no stream).
    pub share: Option<f64>,
    /// Good streams per second of the run's wall time (vllm bench serve's "Request goodput").
    pub per_second: Option<f64>,
    /// Per objective, how many streams met it.
    pub objectives: Vec<ObjectiveCount>,
}

/// How many streams met one objective.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectiveCount {
    /// The objective as given.
    pub objective: String,
    /// Streams that met it.
    pub met: u64,
}

// === impl Slo ===

impl FromStr for Slo {
    type Err = SloError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (name, cmp, value) =
            Cmp::split(&text).ok_or_else(|| SloError::NoOperator(text.clone()))?;
        let objective = OBJECTIVES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, o)| *o)
            .ok_or_else(|| SloError::Unknown {
                gate: text.clone(),
                name: name.to_owned(),
            })?;
        let bound = if objective == Objective::Stalls {
            value
                .parse::<u64>()
                .map_err(|_| SloError::BadBound(text.clone()))? as f64
        } else {
            parse_duration(value)
                .map_err(|_| SloError::BadBound(text.clone()))?
                .as_secs_f64()
                * 1e3
        };
        Ok(Slo {
            objective,
            cmp,
            bound,
            text,
        })
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses `--slo`: objectives separated by commas.
pub fn parse_slo(text: &str) -> Result<Vec<Slo>, SloError> {
    let slos = text
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Slo>, _>>()?;
    if slos.is_empty() {
        return Err(SloError::Empty);
    }
    Ok(slos)
}

// === impl StreamFigures ===

impl StreamFigures {
    /// The figures of a stream that ended well; `None` for a failed stream (it meets nothing).
    pub fn of(stream: &StreamRecord, stall_threshold: Duration) -> Option<Self> {
        if stream.error.is_some() {
            return None;
        }
        let ttft = stream.ttft()?;
        let e2el = stream.finished?.saturating_duration_since(stream.scheduled);
        let mut gaps: Vec<Duration> = stream.gaps().collect();
        gaps.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Some(StreamFigures::from_latencies(
            ms(ttft),
            ms(e2el),
            stream.output_tokens(),
            nearest_rank(&gaps, 99).map_or(0.0, ms),
            gaps.last().copied().map_or(0.0, ms),
            gaps.iter().filter(|g| **g > stall_threshold).count() as f64,
        ))
    }

    /// The figures from the raw numbers, with vllm bench's TPOT: (e2el - ttft) / (tokens - 1),
    /// 0 for one token or none.
    pub fn from_latencies(
        ttft_ms: f64,
        e2el_ms: f64,
        output_tokens: u64,
        itl_p99_ms: f64,
        itl_max_ms: f64,
        stalls: f64,
    ) -> Self {
        let tpot_ms = if output_tokens > 1 {
            (e2el_ms - ttft_ms) / (output_tokens - 1) as f64
        } else {
            0.0
        };
        StreamFigures {
            ttft_ms,
            tpot_ms,
            e2el_ms,
            itl_p99_ms,
            itl_max_ms,
            stalls,
        }
    }

    fn value(&self, objective: Objective) -> f64 {
        match objective {
            Objective::Ttft => self.ttft_ms,
            Objective::Tpot => self.tpot_ms,
            Objective::E2el => self.e2el_ms,
            Objective::ItlP99 => self.itl_p99_ms,
            Objective::ItlMax => self.itl_max_ms,
            Objective::Stalls => self.stalls,
        }
    }

    /// Whether these figures meet `slo`.
    pub fn meets(&self, slo: &Slo) -> bool {
        slo.cmp.holds(self.value(slo.objective), slo.bound)
    }
}

/// Judges every stream (`None` is a failed stream) against `slos`; `wall` is the run's length.
pub fn goodput(
    text: &str,
    slos: &[Slo],
    streams: &[Option<StreamFigures>],
    wall: Duration,
) -> Goodput {
    let mut met = vec![0u64; slos.len()];
    let mut good = 0;
    for figures in streams.iter().flatten() {
        let mut all = true;
        for (slo, count) in slos.iter().zip(&mut met) {
            if figures.meets(slo) {
                *count += 1;
            } else {
                all = false;
            }
        }
        good += u64::from(all);
    }
    let total = streams.len() as u64;
    let seconds = wall.as_secs_f64();
    Goodput {
        slo: text.to_owned(),
        good,
        streams: total,
        share: (total > 0).then(|| good as f64 / total as f64),
        per_second: (seconds > 0.0).then(|| good as f64 / seconds),
        objectives: slos
            .iter()
            .zip(met)
            .map(|(slo, met)| ObjectiveCount {
                objective: slo.text.clone(),
                met,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// vllm bench serve's goodput, as its `calculate_metrics` computes it (vllm/benchmarks/serve.py),
    /// rewritten here as the oracle: for each successful request, `tpot = (latency - ttft) /
    /// (output_len - 1)` if output_len > 1 else 0; a request is good when `slo >= metric` for
    /// every configured SLO (ttft, tpot, e2el, in ms); goodput = good / duration.
    fn vllm_good_completed(
        requests: &[(bool, f64, f64, u64)],
        ttft_slo: Option<f64>,
        tpot_slo: Option<f64>,
        e2el_slo: Option<f64>,
    ) -> u64 {
        let (mut ttfts, mut all_tpots, mut e2els) = (vec![], vec![], vec![]);
        for &(success, ttft, latency, output_len) in requests {
            if !success {
                continue;
            }
            let mut tpot = 0.0;
            if output_len > 1 {
                tpot = (latency - ttft) / (output_len - 1) as f64;
            }
            all_tpots.push(tpot);
            ttfts.push(ttft);
            e2els.push(latency);
        }
        let mut valid: Vec<&Vec<f64>> = vec![];
        let mut slo_values = vec![];
        if let Some(s) = ttft_slo {
            valid.push(&ttfts);
            slo_values.push(s);
        }
        if let Some(s) = tpot_slo {
            valid.push(&all_tpots);
            slo_values.push(s);
        }
        if let Some(s) = e2el_slo {
            valid.push(&e2els);
            slo_values.push(s);
        }
        let mut good = 0;
        for i in 0..ttfts.len() {
            if slo_values.iter().zip(&valid).all(|(s, m)| *s >= m[i]) {
                good += 1;
            }
        }
        good
    }

    fn ours(
        requests: &[(bool, f64, f64, u64)],
        ttft_slo: Option<f64>,
        tpot_slo: Option<f64>,
        e2el_slo: Option<f64>,
    ) -> Goodput {
        // The bounds as `--slo 'ttft<=500ms,...'` parses them (the parser has its own test), built
        // directly so both sides compare exactly the same numbers.
        let slos: Vec<Slo> = [
            (Objective::Ttft, ttft_slo),
            (Objective::Tpot, tpot_slo),
            (Objective::E2el, e2el_slo),
        ]
        .into_iter()
        .filter_map(|(objective, bound)| {
            Some(Slo {
                objective,
                cmp: Cmp::Le,
                bound: bound?,
                text: format!("{objective:?}<={}ms", bound?),
            })
        })
        .collect();
        let text = "vllm";
        let figures: Vec<Option<StreamFigures>> = requests
            .iter()
            .map(|&(success, ttft, latency, tokens)| {
                success.then(|| StreamFigures::from_latencies(ttft, latency, tokens, 0.0, 0.0, 0.0))
            })
            .collect();
        goodput(text, &slos, &figures, Duration::from_secs(10))
    }

    #[test]
    fn parses_objectives() {
        let slos = parse_slo("ttft<500ms, tpot<=50ms,itl_p99<100ms,stalls==0,e2el>=1s").unwrap();
        assert_eq!(slos.len(), 5);
        assert_eq!(
            (slos[0].objective, slos[0].cmp, slos[0].bound),
            (Objective::Ttft, Cmp::Lt, 500.0)
        );
        assert_eq!((slos[1].cmp, slos[1].bound), (Cmp::Le, 50.0));
        assert_eq!(
            (slos[3].objective, slos[3].cmp, slos[3].bound),
            (Objective::Stalls, Cmp::Eq, 0.0)
        );
        assert_eq!((slos[4].cmp, slos[4].bound), (Cmp::Ge, 1000.0));
        assert!(matches!(parse_slo("ttft"), Err(SloError::NoOperator(_))));
        assert!(matches!(
            parse_slo("ttft=5ms"),
            Err(SloError::NoOperator(_))
        ));
        assert!(matches!(
            parse_slo("itl_p98<5ms"),
            Err(SloError::Unknown { .. })
        ));
        assert!(matches!(parse_slo("ttft<500"), Err(SloError::BadBound(_))));
        assert!(matches!(
            parse_slo("stalls<1.5"),
            Err(SloError::BadBound(_))
        ));
        assert!(matches!(parse_slo(" , "), Err(SloError::Empty)));
    }

    #[test]
    fn matches_vllm_on_hand_picked_requests() {
        // (success, ttft ms, latency ms, output tokens)
        let requests = [
            (true, 100.0, 1100.0, 21), // tpot 50: good at tpot<=50 (vLLM's >=)
            (true, 500.0, 900.0, 9),   // ttft exactly 500: good
            (true, 501.0, 900.0, 9),   // ttft over
            (true, 10.0, 2000.0, 11),  // tpot 199: bad
            (true, 300.0, 300.0, 1),   // one token: tpot 0, good
            (false, 0.0, 0.0, 0),      // failed: never good
        ];
        let g = ours(&requests, Some(500.0), Some(50.0), None);
        assert_eq!(
            g.good,
            vllm_good_completed(&requests, Some(500.0), Some(50.0), None)
        );
        assert_eq!(g.good, 3);
        assert_eq!(g.streams, 6);
        assert_eq!(g.share, Some(0.5));
        assert_eq!(g.per_second, Some(0.3));
        assert_eq!(g.objectives[0].met, 4);
        assert_eq!(g.objectives[1].met, 4);
    }

    proptest! {
        #[test]
        fn good_count_equals_vllm_bench_serve(
            requests in proptest::collection::vec(
                (proptest::bool::weighted(0.9), 0u32..2000, 0u32..5000, 0u64..200), 0..60),
            ttft in proptest::option::of(1u32..2000),
            tpot in proptest::option::of(1u32..200),
            e2el in proptest::option::of(1u32..8000),
        ) {
            prop_assume!(ttft.is_some() || tpot.is_some() || e2el.is_some());
            // Whole milliseconds, so both sides compare the same binary numbers.
            let requests: Vec<(bool, f64, f64, u64)> = requests
                .into_iter()
                .map(|(ok, t, extra, n)| (ok, f64::from(t), f64::from(t + extra), n))
                .collect();
            let (ttft, tpot, e2el) = (ttft.map(f64::from), tpot.map(f64::from), e2el.map(f64::from));
            let g = ours(&requests, ttft, tpot, e2el);
            prop_assert_eq!(g.good, vllm_good_completed(&requests, ttft, tpot, e2el));
            prop_assert_eq!(g.per_second, Some(g.good as f64 / 10.0));
        }
    }
}
