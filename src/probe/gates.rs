//! Gates: `--assert 'itl_p99<250ms'` turns the probe into a CI check.
//!
//! A gate is `<metric><op><value>` with op `<`, `<=`, `>`, `>=` or `==` (the operators of
//! `--slo`, [`Cmp`]). Latency metrics (`itl_*`, `ttft_*`) take a duration with its unit (`250ms`,
//! `2s`); every other metric takes a plain number. A gate whose metric has no data (no token
//! events at all) fails: a CI gate never passes on an empty run. A gate of a run that never took
//! place (no model could be found, a usage error) is not measured, and says so in every report.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::ser::SerializeStruct;
use serde::Serialize;

use super::compare::Cmp;
use super::stats::{Quantiles, Report};
use super::stream::Phase;
use crate::units::{format_duration, parse_duration};

/// What a gate can check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Median per-stream tokens/s.
    TpsP50,
    /// 5th percentile per-stream tokens/s (the slow streams).
    TpsP5,
    /// Pooled gap median.
    ItlP50,
    /// Pooled gap p95.
    ItlP95,
    /// Pooled gap p99.
    ItlP99,
    /// Longest gap.
    ItlMax,
    /// TTFT median.
    TtftP50,
    /// TTFT p95.
    TtftP95,
    /// TTFT p99.
    TtftP99,
    /// Longest TTFT.
    TtftMax,
    /// Pooled jank ratio.
    Jank,
    /// Median per-stream jank ratio.
    StreamJankP50,
    /// p95 per-stream jank ratio.
    StreamJankP95,
    /// Percentage of gaps that are stalls.
    StallPct,
    /// Percentage of streams with at least one stall.
    StalledStreamsPct,
    /// Failed streams.
    Errors,
    /// Share (0-1) of streams meeting every `--slo` objective.
    Goodput,
    /// Streams meeting every `--slo` objective per second (vllm bench serve's goodput).
    GoodputRps,
    /// Completed streams per second.
    Rps,
    /// Output tokens per second, all streams together.
    OutputTps,
    /// TTFO (to the first token event that is not reasoning) at a quantile.
    Ttfo(Q),
    /// The gaps that end at token events of a phase, at a quantile.
    PhaseItl(Phase, Q),
}

/// Which quantile of a latency a gate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q {
    /// Median.
    P50,
    /// 95th percentile.
    P95,
    /// 99th percentile.
    P99,
    /// The largest.
    Max,
}

// === impl Q ===

impl Q {
    /// The quantile's value in `q`.
    fn of(self, q: &Quantiles) -> Option<f64> {
        match self {
            Q::P50 => q.p50,
            Q::P95 => q.p95,
            Q::P99 => q.p99,
            Q::Max => q.max,
        }
    }

    /// Its key in a `--json` report.
    fn key(self) -> &'static str {
        match self {
            Q::P50 => "p50",
            Q::P95 => "p95",
            Q::P99 => "p99",
            Q::Max => "max",
        }
    }
}

/// The per-phase gap gates' names, in [`METRICS`]'s order.
const fn phase_itl(phase: Phase, q: Q) -> Metric {
    Metric::PhaseItl(phase, q)
}

/// Every metric with its name, for parsing and for the error that lists them.
pub const METRICS: [(&str, Metric); 36] = [
    ("tps_p50", Metric::TpsP50),
    ("tps_p5", Metric::TpsP5),
    ("itl_p50", Metric::ItlP50),
    ("itl_p95", Metric::ItlP95),
    ("itl_p99", Metric::ItlP99),
    ("itl_max", Metric::ItlMax),
    ("ttft_p50", Metric::TtftP50),
    ("ttft_p95", Metric::TtftP95),
    ("ttft_p99", Metric::TtftP99),
    ("ttft_max", Metric::TtftMax),
    ("jank", Metric::Jank),
    ("stream_jank_p50", Metric::StreamJankP50),
    ("stream_jank_p95", Metric::StreamJankP95),
    ("stall_pct", Metric::StallPct),
    ("stalled_streams_pct", Metric::StalledStreamsPct),
    ("errors", Metric::Errors),
    ("goodput", Metric::Goodput),
    ("goodput_rps", Metric::GoodputRps),
    ("rps", Metric::Rps),
    ("output_tps", Metric::OutputTps),
    ("ttfo_p50", Metric::Ttfo(Q::P50)),
    ("ttfo_p95", Metric::Ttfo(Q::P95)),
    ("ttfo_p99", Metric::Ttfo(Q::P99)),
    ("ttfo_max", Metric::Ttfo(Q::Max)),
    ("itl_reasoning_p50", phase_itl(Phase::Reasoning, Q::P50)),
    ("itl_reasoning_p95", phase_itl(Phase::Reasoning, Q::P95)),
    ("itl_reasoning_p99", phase_itl(Phase::Reasoning, Q::P99)),
    ("itl_reasoning_max", phase_itl(Phase::Reasoning, Q::Max)),
    ("itl_content_p50", phase_itl(Phase::Content, Q::P50)),
    ("itl_content_p95", phase_itl(Phase::Content, Q::P95)),
    ("itl_content_p99", phase_itl(Phase::Content, Q::P99)),
    ("itl_content_max", phase_itl(Phase::Content, Q::Max)),
    ("itl_tool_call_p50", phase_itl(Phase::ToolCall, Q::P50)),
    ("itl_tool_call_p95", phase_itl(Phase::ToolCall, Q::P95)),
    ("itl_tool_call_p99", phase_itl(Phase::ToolCall, Q::P99)),
    ("itl_tool_call_max", phase_itl(Phase::ToolCall, Q::Max)),
];

/// What a gate compares with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// A fixed number, in the metric's report unit (milliseconds for latencies).
    Value(f64),
    /// `factor` times the same metric in the `--baseline` report (`1.1*baseline`).
    Baseline(f64),
}

/// One parsed gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// What is checked.
    pub metric: Metric,
    /// How it is compared.
    pub op: Cmp,
    /// The bound: a number in the metric's report unit (milliseconds for latencies), or a
    /// multiple of the baseline's value.
    pub bound: Bound,
    /// The gate as the user wrote it (without spaces), for messages.
    pub text: String,
}

/// The result of checking one gate against a report.
#[derive(Debug, Clone, PartialEq)]
pub struct GateOutcome {
    /// The gate.
    pub gate: Gate,
    /// The measured value (milliseconds for latencies), `None` when there was no data.
    pub measured: Option<f64>,
    /// The bound the value was compared with (`None`: a baseline bound without a baseline value).
    pub threshold: Option<f64>,
    /// The baseline's value, for a gate that names the baseline.
    pub baseline: Option<f64>,
    /// Passed, failed, or not measured at all.
    pub result: GateResult,
}

/// What became of a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateResult {
    /// The measured value satisfies the gate.
    Pass,
    /// It does not, or there was no data to measure it (a gate never passes on an empty run).
    Fail,
    /// The run never took place (no model, a usage error): nothing was measured.
    NotMeasured,
}

/// A gate that cannot be parsed: a usage error (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// No comparison operator.
    #[error("gate `{0}` has no comparison (write e.g. `itl_p99<250ms`; operators < <= > >= ==)")]
    NoOperator(String),
    /// The metric name is not known.
    #[error("gate `{gate}` checks `{metric}`, which is not a metric (known: {known})")]
    UnknownMetric {
        /// The whole gate.
        gate: String,
        /// The unknown name.
        metric: String,
        /// The metrics that exist.
        known: String,
    },
    /// The bound of a latency gate is not a duration.
    #[error("gate `{gate}` needs a duration with a unit: {reason}")]
    BadDuration {
        /// The whole gate.
        gate: String,
        /// Why the duration does not parse.
        reason: String,
    },
    /// The bound of another gate is not a plain number.
    #[error("gate `{0}` needs a plain number (no unit)")]
    BadNumber(String),
    /// A gate names the baseline, but no `--baseline` report was given.
    #[error("gate `{0}` compares with the baseline: give --baseline FILE.json")]
    NoBaseline(String),
}

// === impl Metric ===

impl Metric {
    /// The metric's name in gates.
    pub fn name(self) -> &'static str {
        METRICS
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("?", |(name, _)| name)
    }

    /// Latency metrics take and show durations; the others are plain numbers.
    pub fn is_duration(self) -> bool {
        matches!(
            self,
            Metric::ItlP50
                | Metric::ItlP95
                | Metric::ItlP99
                | Metric::ItlMax
                | Metric::TtftP50
                | Metric::TtftP95
                | Metric::TtftP99
                | Metric::TtftMax
                | Metric::Ttfo(_)
                | Metric::PhaseItl(..)
        )
    }

    /// The metric's value in `report` (milliseconds for latencies), `None` without data.
    pub fn measure(self, report: &Report) -> Option<f64> {
        match self {
            Metric::TpsP50 => report.tokens_per_second.p50,
            Metric::TpsP5 => report.tokens_per_second.p5,
            Metric::ItlP50 => report.itl_ms.p50,
            Metric::ItlP95 => report.itl_ms.p95,
            Metric::ItlP99 => report.itl_ms.p99,
            Metric::ItlMax => report.itl_ms.max,
            Metric::TtftP50 => report.ttft_ms.p50,
            Metric::TtftP95 => report.ttft_ms.p95,
            Metric::TtftP99 => report.ttft_ms.p99,
            Metric::TtftMax => report.ttft_ms.max,
            Metric::Jank => report.jank_ratio,
            Metric::StreamJankP50 => report.stream_jank_ratio.p50,
            Metric::StreamJankP95 => report.stream_jank_ratio.p95,
            Metric::StallPct => report.stall_pct,
            Metric::StalledStreamsPct => report.stalled_streams_pct,
            Metric::Errors => Some(report.errors as f64),
            Metric::Goodput => report.goodput.as_ref().and_then(|g| g.share),
            Metric::GoodputRps => report.goodput.as_ref().and_then(|g| g.per_second),
            Metric::Rps => report.throughput.requests_per_second,
            Metric::OutputTps => report.throughput.output_tokens_per_second,
            Metric::Ttfo(q) => q.of(&report.ttfo_ms),
            Metric::PhaseItl(phase, q) => {
                q.of(&report.phases.as_ref()?.get(phase.as_str())?.itl_ms)
            }
        }
    }

    /// Where the metric is in a `--json` report.
    pub fn json_path(self) -> &'static [&'static str] {
        match self {
            Metric::TpsP50 => &["tokens_per_second", "p50"],
            Metric::TpsP5 => &["tokens_per_second", "p5"],
            Metric::ItlP50 => &["itl_ms", "p50"],
            Metric::ItlP95 => &["itl_ms", "p95"],
            Metric::ItlP99 => &["itl_ms", "p99"],
            Metric::ItlMax => &["itl_ms", "max"],
            Metric::TtftP50 => &["ttft_ms", "p50"],
            Metric::TtftP95 => &["ttft_ms", "p95"],
            Metric::TtftP99 => &["ttft_ms", "p99"],
            Metric::TtftMax => &["ttft_ms", "max"],
            Metric::Jank => &["jank_ratio"],
            Metric::StreamJankP50 => &["stream_jank_ratio", "p50"],
            Metric::StreamJankP95 => &["stream_jank_ratio", "p95"],
            Metric::StallPct => &["stall_pct"],
            Metric::StalledStreamsPct => &["stalled_streams_pct"],
            Metric::Errors => &["errors"],
            Metric::Goodput => &["goodput", "share"],
            Metric::GoodputRps => &["goodput", "per_second"],
            Metric::Rps => &["throughput", "requests_per_second"],
            Metric::OutputTps => &["throughput", "output_tokens_per_second"],
            Metric::Ttfo(q) => match q {
                Q::P50 => &["ttfo_ms", "p50"],
                Q::P95 => &["ttfo_ms", "p95"],
                Q::P99 => &["ttfo_ms", "p99"],
                Q::Max => &["ttfo_ms", "max"],
            },
            Metric::PhaseItl(phase, q) => phase_itl_path(phase, q),
        }
    }

    /// The metric's value in a `--json` report read back (`None` when absent or null).
    pub fn from_json(self, report: &serde_json::Value) -> Option<f64> {
        self.json_path()
            .iter()
            .try_fold(report, |v, key| v.get(key))?
            .as_f64()
    }

    /// A value of this metric as people read it (`312.4ms`, `2.56`, `3`).
    pub fn format(self, value: f64) -> String {
        if self.is_duration() {
            format_duration(Duration::from_secs_f64(value.max(0.0) / 1e3))
        } else if self == Metric::Errors {
            format!("{value:.0}")
        } else {
            format!("{value:.2}")
        }
    }
}

/// Where a phase's gap quantile is in a `--json` report: `phases.<phase>.itl_ms.<q>`.
fn phase_itl_path(phase: Phase, q: Q) -> &'static [&'static str] {
    macro_rules! paths {
        ($($phase:ident => $name:literal),*) => {
            match (phase, q) {
                $(
                    (Phase::$phase, Q::P50) => &["phases", $name, "itl_ms", "p50"],
                    (Phase::$phase, Q::P95) => &["phases", $name, "itl_ms", "p95"],
                    (Phase::$phase, Q::P99) => &["phases", $name, "itl_ms", "p99"],
                    (Phase::$phase, Q::Max) => &["phases", $name, "itl_ms", "max"],
                )*
            }
        };
    }
    debug_assert!(matches!(q.key(), "p50" | "p95" | "p99" | "max"));
    paths!(Reasoning => "reasoning", Content => "content", ToolCall => "tool_call")
}

// === impl Gate ===

impl FromStr for Gate {
    type Err = GateError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (name, op, value) =
            Cmp::split(&text).ok_or_else(|| GateError::NoOperator(text.clone()))?;
        let metric = METRICS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| *m)
            .ok_or_else(|| GateError::UnknownMetric {
                gate: text.clone(),
                metric: name.to_owned(),
                known: METRICS.map(|(n, _)| n).join(", "),
            })?;
        let bound = if let Some(factor) = baseline_factor(value) {
            Bound::Baseline(factor.ok_or_else(|| GateError::BadNumber(text.clone()))?)
        } else if metric.is_duration() {
            let d = parse_duration(value).map_err(|reason| GateError::BadDuration {
                gate: text.clone(),
                reason,
            })?;
            Bound::Value(d.as_secs_f64() * 1e3)
        } else {
            Bound::Value(
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| GateError::BadNumber(text.clone()))?,
            )
        };
        Ok(Gate {
            metric,
            op,
            bound,
            text,
        })
    }
}

/// `baseline` → factor 1, `1.1*baseline` → 1.1; `Some(None)` when the factor is not a number;
/// `None` when the bound does not name the baseline.
fn baseline_factor(value: &str) -> Option<Option<f64>> {
    if value == "baseline" {
        return Some(Some(1.0));
    }
    let factor = value.strip_suffix("*baseline")?;
    Some(
        factor
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0),
    )
}

// === impl Gate ===

impl Gate {
    /// Whether the gate compares with the baseline.
    pub fn needs_baseline(&self) -> bool {
        matches!(self.bound, Bound::Baseline(_))
    }
}

// === impl GateResult ===

impl GateResult {
    /// `PASS`, `FAIL` or `NOT MEASURED`, as the text and CI reports show it.
    pub fn word(self) -> &'static str {
        match self {
            GateResult::Pass => "PASS",
            GateResult::Fail => "FAIL",
            GateResult::NotMeasured => "NOT MEASURED",
        }
    }

    /// `pass`, `fail` or `not_measured`, as the JSON has it.
    pub fn key(self) -> &'static str {
        match self {
            GateResult::Pass => "pass",
            GateResult::Fail => "fail",
            GateResult::NotMeasured => "not_measured",
        }
    }
}

// === impl GateOutcome ===

impl GateOutcome {
    /// Whether the gate passed.
    pub fn passed(&self) -> bool {
        self.result == GateResult::Pass
    }

    /// The gate of a run that never took place.
    pub fn not_measured(gate: &Gate) -> Self {
        GateOutcome {
            gate: gate.clone(),
            measured: None,
            threshold: None,
            baseline: None,
            result: GateResult::NotMeasured,
        }
    }

    /// What was measured and against what: `measured 312.4ms`, `measured 312.4ms, bound 330.0ms
    /// (baseline 300.0ms)`, `measured no data`, `the run did not take place`.
    pub fn detail(&self) -> String {
        if self.result == GateResult::NotMeasured {
            return "the run did not take place".to_owned();
        }
        let mut text = format!("measured {}", self.measured_text());
        if self.gate.needs_baseline() {
            let metric = self.gate.metric;
            match (self.threshold, self.baseline) {
                (Some(t), Some(b)) => text.push_str(&format!(
                    ", bound {} (baseline {})",
                    metric.format(t),
                    metric.format(b)
                )),
                _ => text.push_str(", the baseline has no data"),
            }
        }
        text
    }

    /// What was measured, as people read it: `312.4ms`, `no data`, `not measured`.
    pub fn measured_text(&self) -> String {
        match (self.result, self.measured) {
            (GateResult::NotMeasured, _) => "not measured".to_owned(),
            (_, Some(v)) => self.gate.metric.format(v),
            (_, None) => "no data".to_owned(),
        }
    }
}

impl fmt::Display for GateOutcome {
    /// `PASS itl_p99<250ms: measured 31.2ms`, `FAIL ...: measured no data`, or
    /// `NOT MEASURED ...: the run did not take place`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.result.word(),
            self.gate.text,
            self.detail()
        )
    }
}

impl Serialize for GateOutcome {
    /// `{"gate": "itl_p99<250ms", "metric": "itl_p99", "op": "<", "bound": 250.0,
    /// "baseline": null, "value": 312.4, "unit": "ms", "result": "fail"}`: the JSON's `gates`.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let metric = self.gate.metric;
        let mut gate = serializer.serialize_struct("GateOutcome", 8)?;
        gate.serialize_field("gate", &self.gate.text)?;
        gate.serialize_field("metric", metric.name())?;
        gate.serialize_field("op", self.gate.op.symbol())?;
        let bound = match self.gate.bound {
            Bound::Value(v) => Some(v),
            Bound::Baseline(_) => self.threshold,
        };
        gate.serialize_field("bound", &bound)?;
        gate.serialize_field("baseline", &self.baseline)?;
        gate.serialize_field("value", &self.measured)?;
        gate.serialize_field("unit", &metric.is_duration().then_some("ms"))?;
        gate.serialize_field("result", self.result.key())?;
        gate.end()
    }
}

/// Parses every `--assert` value; each may hold several gates separated by commas.
pub fn parse_gates<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Gate>, GateError> {
    specs
        .iter()
        .flat_map(|spec| spec.as_ref().split(','))
        .filter(|part| !part.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// Refuses gates that name the baseline when there is none (a usage error).
pub fn check_baseline(gates: &[Gate], have_baseline: bool) -> Result<(), GateError> {
    match gates.iter().find(|g| g.needs_baseline() && !have_baseline) {
        Some(gate) => Err(GateError::NoBaseline(gate.text.clone())),
        None => Ok(()),
    }
}

/// Checks every gate against `report`, in order; gates naming the baseline read its value from
/// `baseline` (a `--json` report read back). A gate without data, or whose baseline has none,
/// fails.
pub fn evaluate(
    gates: &[Gate],
    report: &Report,
    baseline: Option<&serde_json::Value>,
) -> Vec<GateOutcome> {
    gates
        .iter()
        .map(|gate| {
            let measured = gate.metric.measure(report);
            let (threshold, base) = match gate.bound {
                Bound::Value(v) => (Some(v), None),
                Bound::Baseline(factor) => {
                    let base = baseline.and_then(|b| gate.metric.from_json(b));
                    (base.map(|b| b * factor), base)
                }
            };
            let result = match (measured, threshold) {
                (Some(v), Some(t)) if gate.op.holds(v, t) => GateResult::Pass,
                _ => GateResult::Fail,
            };
            GateOutcome {
                gate: gate.clone(),
                measured,
                threshold,
                baseline: base,
                result,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_gates_scale_the_baselines_value() {
        let baseline =
            serde_json::json!({"itl_ms": {"p99": 300.0}, "tokens_per_second": {"p50": 40.0}});
        let gates =
            parse_gates(&["itl_p99<1.1*baseline,tps_p50>0.95*baseline,ttft_p50<baseline"]).unwrap();
        assert!(check_baseline(&gates, false).is_err());
        assert!(check_baseline(&gates, true).is_ok());
        let outcomes = evaluate(&gates, &report(), Some(&baseline));
        // 312.4 < 330: pass; 30 > 38: fail; the baseline has no ttft: fail.
        assert!(outcomes[0].passed());
        assert_eq!(
            outcomes[0].to_string(),
            "PASS itl_p99<1.1*baseline: measured 312.4ms, bound 330.0ms (baseline 300.0ms)"
        );
        assert!(!outcomes[1].passed());
        assert_eq!(
            outcomes[1].to_string(),
            "FAIL tps_p50>0.95*baseline: measured 30.00, bound 38.00 (baseline 40.00)"
        );
        assert!(!outcomes[2].passed());
        assert_eq!(
            outcomes[2].to_string(),
            "FAIL ttft_p50<baseline: measured 100.0ms, the baseline has no data"
        );
    }
    use crate::probe::stats::{Quantiles, ReadingBands, ReportDetail, StreamJank, TokensPerSecond};
    use crate::probe::verdict::Verdict;

    fn report() -> Report {
        Report {
            requests: 10,
            errors: 0,
            ttfo_ms: Quantiles {
                p50: Some(900.0),
                p95: Some(1500.0),
                p99: Some(2500.0),
                max: Some(3000.0),
            },
            ttft_ms: Quantiles {
                p50: Some(100.0),
                p95: Some(150.0),
                p99: Some(180.0),
                max: Some(190.0),
            },
            itl_ms: Quantiles {
                p50: Some(30.0),
                p95: Some(31.0),
                p99: Some(312.4),
                max: Some(330.0),
            },
            tokens_per_second: TokensPerSecond {
                p50: Some(30.0),
                p5: Some(4.0),
            },
            stall_pct: Some(100.0 / 39.0),
            stalled_streams_pct: Some(30.0),
            jank_ratio: Some(10.4),
            stream_jank_ratio: StreamJank {
                p50: Some(10.0),
                p95: None,
            },
            verdict: Verdict::Janky,
            reading_bands: ReadingBands::default(),
            phases: None,
            attribution: None,
            throughput: Default::default(),
            goodput: None,
            meta: None,
            detail: ReportDetail::default(),
        }
    }

    fn check(gate: &str) -> GateOutcome {
        let gates = parse_gates(&[gate]).unwrap();
        evaluate(&gates, &report(), None).remove(0)
    }

    #[test]
    fn parses_operators_units_and_commas() {
        let gates = parse_gates(&["itl_p99<250ms, tps_p50>=10", "errors<1"]).unwrap();
        assert_eq!(gates.len(), 3);
        assert_eq!(gates[0].metric, Metric::ItlP99);
        assert_eq!(gates[0].op, Cmp::Lt);
        assert_eq!(gates[0].bound, Bound::Value(250.0));
        assert_eq!(gates[1].metric, Metric::TpsP50);
        assert_eq!(gates[1].op, Cmp::Ge);
        assert_eq!(gates[1].text, "tps_p50>=10");
        assert_eq!(gates[2].op, Cmp::Lt);
        let g: Gate = "ttft_p95 <= 2s".parse().unwrap();
        assert_eq!(
            (g.metric, g.op, g.bound),
            (Metric::TtftP95, Cmp::Le, Bound::Value(2000.0))
        );
        let g: Gate = "stall_pct>0.5".parse().unwrap();
        assert_eq!((g.op, g.bound), (Cmp::Gt, Bound::Value(0.5)));
        let g: Gate = "itl_p99 < 1.1*baseline".parse().unwrap();
        assert_eq!((g.op, g.bound), (Cmp::Lt, Bound::Baseline(1.1)));
        let g: Gate = "tps_p50>baseline".parse().unwrap();
        assert_eq!(g.bound, Bound::Baseline(1.0));
        assert!(matches!(
            "tps_p50>x*baseline".parse::<Gate>(),
            Err(GateError::BadNumber(_))
        ));
        let g: Gate = "goodput>=0.99".parse().unwrap();
        assert_eq!((g.metric, g.bound), (Metric::Goodput, Bound::Value(0.99)));
        for (name, metric) in METRICS {
            assert_eq!(metric.name(), name);
        }
    }

    #[test]
    fn a_gate_reads_back_from_json_with_its_expression_value_and_result() {
        let json = serde_json::to_value(check("itl_p99<250ms")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"gate": "itl_p99<250ms", "metric": "itl_p99", "op": "<",
                "bound": 250.0, "baseline": null, "value": 312.4, "unit": "ms", "result": "fail"})
        );
        let gate: Gate = "errors==0".parse().unwrap();
        let skipped = GateOutcome::not_measured(&gate);
        assert_eq!(
            skipped.to_string(),
            "NOT MEASURED errors==0: the run did not take place"
        );
        let json = serde_json::to_value(&skipped).unwrap();
        assert_eq!(json["result"], "not_measured");
        assert_eq!(
            (json["value"].clone(), json["unit"].clone()),
            (serde_json::Value::Null, serde_json::Value::Null)
        );
        assert_eq!(json["bound"], 0.0);
    }

    #[test]
    fn ttfo_and_per_phase_gaps_are_gates() {
        let gates = parse_gates(&[
            "ttfo_p99<8s",
            "itl_content_p99<=250ms",
            "itl_reasoning_max<1s",
        ])
        .unwrap();
        assert_eq!(gates[0].metric, Metric::Ttfo(Q::P99));
        assert_eq!(gates[0].bound, Bound::Value(8000.0));
        assert_eq!(gates[1].metric, Metric::PhaseItl(Phase::Content, Q::P99));
        let mut r = report();
        assert_eq!(Metric::Ttfo(Q::P99).measure(&r), Some(2500.0));
        assert_eq!(
            gates[1].metric.measure(&r),
            None,
            "no phases: no data, the gate fails"
        );
        let content = crate::probe::stats::PhaseFigures {
            token_events: 40,
            itl_ms: Quantiles {
                p50: Some(20.0),
                p95: Some(30.0),
                p99: Some(240.0),
                max: Some(300.0),
            },
            ..Default::default()
        };
        r.phases = Some([("content", content)].into_iter().collect());
        assert_eq!(gates[1].metric.measure(&r), Some(240.0));
        let json = serde_json::to_value(&r).unwrap();
        for (name, metric) in METRICS {
            assert_eq!(metric.from_json(&json), metric.measure(&r), "{name}");
        }
    }

    #[test]
    fn refuses_bad_gates() {
        assert!(matches!(
            parse_gates(&["itl_p99"]),
            Err(GateError::NoOperator(_))
        ));
        assert!(matches!(
            parse_gates(&["itl_p99=5ms"]),
            Err(GateError::NoOperator(_))
        ));
        assert!(matches!(
            parse_gates(&["itl_p98<5ms"]),
            Err(GateError::UnknownMetric { .. })
        ));
        assert!(matches!(
            parse_gates(&["itl_p99<250"]),
            Err(GateError::BadDuration { .. })
        ));
        assert!(matches!(
            parse_gates(&["tps_p50>10tok"]),
            Err(GateError::BadNumber(_))
        ));
        assert!(matches!(
            parse_gates(&["jank<5ms"]),
            Err(GateError::BadNumber(_))
        ));
        assert!(matches!(
            parse_gates(&["errors<"]),
            Err(GateError::BadNumber(_))
        ));
        assert!(matches!(
            parse_gates(&["<5"]),
            Err(GateError::UnknownMetric { .. })
        ));
    }

    #[test]
    fn evaluates_and_reports_measured_values() {
        let failed = check("itl_p99<250ms");
        assert!(!failed.passed());
        assert_eq!(failed.to_string(), "FAIL itl_p99<250ms: measured 312.4ms");
        let passed = check("itl_p50<=30ms");
        assert!(passed.passed());
        assert_eq!(passed.to_string(), "PASS itl_p50<=30ms: measured 30.0ms");
        assert!(check("tps_p50>10").passed());
        assert!(!check("tps_p5>5").passed());
        assert!(check("ttft_max<2s").passed());
        assert!(!check("jank<5").passed());
        assert!(check("errors<1").passed());
        assert_eq!(check("errors<1").to_string(), "PASS errors<1: measured 0");
        assert!(!check("stall_pct<1").passed());
        assert_eq!(
            check("stall_pct<1").to_string(),
            "FAIL stall_pct<1: measured 2.56"
        );
        assert!(!check("goodput>=0.5").passed(), "no --slo, no goodput");
        // `==` as `--slo` has it.
        assert!(check("errors==0").passed());
        assert!(!check("errors==1").passed());
        assert_eq!(
            check("errors == 0").to_string(),
            "PASS errors==0: measured 0"
        );
        // No data never passes.
        let none = check("stream_jank_p95<100");
        assert!(!none.passed());
        assert_eq!(
            none.to_string(),
            "FAIL stream_jank_p95<100: measured no data"
        );
    }
}
