//! What was decided about a run: its gates, whether the run itself failed, and the one
//! [`Status`] that the exit code and every report's headline are both taken from, so that no
//! report can contradict the exit code.
//!
//! The headline is the verdict (SMOOTH or JANKY) only when every gate passed and the run did
//! not fail; a failed gate makes it FAIL and a failed run (or one that never took place) ERROR,
//! whatever the verdict says. The verdict stays in every report beside it.

use serde::Serialize;

use super::gates::{Gate, GateOutcome, GateResult};
use super::stats::Report;
use super::verdict::Verdict;

/// Exit code when every gate passed.
pub const PASSED: u8 = 0;
/// Exit code when a gate failed.
pub const GATE_FAILED: u8 = 1;
/// Exit code for a usage error or a report that cannot be written.
pub const USAGE: u8 = 2;
/// Exit code when the run itself failed (no stream completed, too many failed, no model).
pub const RUN_FAILED: u8 = 3;

/// One run of the command (one rate of a sweep) and what was decided about it.
#[derive(Debug, Clone)]
pub struct Judged {
    /// `rate 2/s` in a sweep, `None` for a single run.
    pub label: Option<String>,
    /// The report (empty for a run that never took place).
    pub report: Report,
    /// The gates, checked (or not measured).
    pub outcomes: Vec<GateOutcome>,
    /// Why the run itself failed, `None` when it did not.
    pub run_failure: Option<RunFailure>,
}

/// Why a run failed (exit 3) or never took place (exit 3 without a model, 2 for a usage error).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// One sentence: `no stream completed (3 of 3 failed)`.
    pub message: String,
    /// What the server or the client said, one line each and bounded: `status (3): the server
    /// answered with status 401: {"error": ...}`.
    pub causes: Vec<String>,
}

/// The kinds of [`RunFailure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Every stream failed.
    NoStreamCompleted,
    /// More than `--max-error-rate` of the streams failed.
    ErrorRate,
    /// No `--model` was given and the server's `/v1/models` did not name one.
    Discovery,
    /// The command line or a file it names cannot be used.
    Usage,
}

/// Where a run, or the runs of a sweep, ended up: the exit code and the headline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every gate passed (or there were none), with this verdict.
    Passed(Verdict),
    /// A gate failed.
    GateFailed,
    /// The run failed or found no model.
    RunFailed,
    /// A usage error: nothing ran.
    Usage,
}

/// The JSON `result` of a run or of a whole sweep.
#[derive(Debug, Serialize)]
pub struct ResultJson<'a> {
    /// `SMOOTH`, `JANKY`, `FAIL` or `ERROR`.
    pub headline: &'static str,
    /// The command's exit code for this result.
    pub exit_code: u8,
    /// One sentence saying why (see [`summary`]).
    pub summary: String,
    /// Gates that passed.
    pub gates_passed: usize,
    /// Gates that failed.
    pub gates_failed: usize,
    /// Gates of a run that never took place.
    pub gates_not_measured: usize,
    /// Why the run failed, `null` when it did not.
    pub failure: Option<&'a RunFailure>,
}

/// One run as the JSON report has it: the report's keys, its gates and its result.
#[derive(Debug, Serialize)]
pub struct RunJson<'a> {
    /// The figures.
    #[serde(flatten)]
    pub report: &'a Report,
    /// Each gate's expression, value and result.
    pub gates: &'a [GateOutcome],
    /// The run's status.
    pub result: ResultJson<'a>,
}

// === impl Judged ===

impl Judged {
    /// A run that took place: its gates checked, its failure (if any) found from its streams.
    /// `gave_up`: the run ended early because its first streams all failed.
    pub fn measured(
        label: Option<String>,
        report: Report,
        outcomes: Vec<GateOutcome>,
        max_error_rate: f64,
        gave_up: bool,
    ) -> Self {
        let run_failure = RunFailure::of(&report, max_error_rate, gave_up);
        Judged {
            label,
            report,
            outcomes,
            run_failure,
        }
    }

    /// A run that never took place: `report` is empty (but for its `meta`), every gate is not
    /// measured.
    pub fn aborted(report: Report, gates: &[Gate], failure: RunFailure) -> Self {
        Judged {
            label: None,
            report,
            outcomes: gates.iter().map(GateOutcome::not_measured).collect(),
            run_failure: Some(failure),
        }
    }

    /// How many gates passed, failed and were not measured.
    pub fn gate_counts(&self) -> (usize, usize, usize) {
        count_gates(std::slice::from_ref(self))
    }

    /// The run with its gates and result, for the JSON report.
    pub fn to_json(&self) -> RunJson<'_> {
        RunJson {
            report: &self.report,
            gates: &self.outcomes,
            result: result_json(std::slice::from_ref(self)),
        }
    }
}

// === impl RunFailure ===

impl RunFailure {
    /// Why the run failed, if it did: no stream completed, or more than `max_error_rate` of them
    /// failed. The causes are the first error of each kind (with its count), which carries the
    /// status and the start of the body the server answered with.
    pub fn of(report: &Report, max_error_rate: f64, gave_up: bool) -> Option<Self> {
        let (n, failed) = (report.requests, report.errors);
        let (kind, mut message) = if n == failed {
            (
                FailureKind::NoStreamCompleted,
                format!("no stream completed ({failed} of {n} failed)"),
            )
        } else {
            let rate = failed as f64 / n as f64;
            if rate <= max_error_rate {
                return None;
            }
            (
                FailureKind::ErrorRate,
                format!(
                    "{failed} of {n} streams failed ({:.1}%, more than --max-error-rate {})",
                    rate * 100.0,
                    max_error_rate
                ),
            )
        };
        if gave_up {
            message.push_str(&format!(
                "; the run ended early, as the first {} streams to end all failed",
                super::backoff::GIVE_UP_AFTER
            ));
        }
        let detail = &report.detail;
        let causes = detail
            .error_examples
            .iter()
            .map(|(kind, example)| {
                let count = detail.errors_by_kind.get(kind).copied().unwrap_or(0);
                format!("{kind} ({count}): {example}")
            })
            .collect();
        Some(RunFailure {
            kind,
            message,
            causes,
        })
    }

    /// The message and the causes on one line, for a JUnit `message` or a Markdown list item.
    pub fn one_line(&self) -> String {
        if self.causes.is_empty() {
            return self.message.clone();
        }
        format!("{}: {}", self.message, self.causes.join("; "))
    }
}

// === impl FailureKind ===

impl FailureKind {
    /// The kind as the JSON and JUnit's `<error type>` name it.
    pub fn key(self) -> &'static str {
        match self {
            FailureKind::NoStreamCompleted => "no_stream_completed",
            FailureKind::ErrorRate => "error_rate",
            FailureKind::Discovery => "discovery",
            FailureKind::Usage => "usage",
        }
    }
}

impl Serialize for FailureKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

// === impl Status ===

impl Status {
    /// The status of `runs` together: a usage error, else a failed run, else a failed gate, else
    /// passed, SMOOTH only when every run is.
    pub fn of(runs: &[Judged]) -> Status {
        let failures = || runs.iter().filter_map(|r| r.run_failure.as_ref());
        if failures().any(|f| f.kind == FailureKind::Usage) {
            Status::Usage
        } else if failures().next().is_some() {
            Status::RunFailed
        } else if runs.iter().any(|r| r.outcomes.iter().any(|o| !o.passed())) {
            Status::GateFailed
        } else if runs.iter().all(|r| r.report.verdict == Verdict::Smooth) {
            Status::Passed(Verdict::Smooth)
        } else {
            Status::Passed(Verdict::Janky)
        }
    }

    /// The command's exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Passed(_) => PASSED,
            Status::GateFailed => GATE_FAILED,
            Status::RunFailed => RUN_FAILED,
            Status::Usage => USAGE,
        }
    }

    /// The headline every report leads with: the verdict only when nothing failed.
    pub fn headline(self) -> &'static str {
        match self {
            Status::Passed(verdict) => verdict.word(),
            Status::GateFailed => "FAIL",
            Status::RunFailed | Status::Usage => "ERROR",
        }
    }
}

/// One sentence under the headline: which gates failed, why the run failed, or that every gate
/// passed, with the verdict beside it when the headline is not the verdict.
pub fn summary(runs: &[Judged]) -> String {
    let status = Status::of(runs);
    let (passed, failed, _) = count_gates(runs);
    let verdict = if runs.iter().all(|r| r.report.verdict == Verdict::Smooth) {
        Verdict::Smooth
    } else {
        Verdict::Janky
    };
    match status {
        Status::Passed(_) if passed == 0 => "no gate was given".to_owned(),
        Status::Passed(_) => format!("every gate passed ({passed})"),
        Status::GateFailed => {
            let names: Vec<&str> = runs
                .iter()
                .flat_map(|r| &r.outcomes)
                .filter(|o| o.result == GateResult::Fail)
                .map(|o| o.gate.text.as_str())
                .collect();
            format!(
                "{failed} of {} gates failed: {}; the verdict alone is {}",
                passed + failed,
                names.join(", "),
                verdict.word()
            )
        }
        Status::RunFailed | Status::Usage => {
            let why: Vec<&str> = runs
                .iter()
                .filter_map(|r| r.run_failure.as_ref())
                .map(|f| f.message.as_str())
                .collect();
            let what = if status == Status::Usage {
                "the probe could not run"
            } else {
                "the run failed"
            };
            format!("{what}: {}", why.join("; "))
        }
    }
}

/// The JSON `result` of `runs` together.
pub fn result_json(runs: &[Judged]) -> ResultJson<'_> {
    let status = Status::of(runs);
    let (gates_passed, gates_failed, gates_not_measured) = count_gates(runs);
    ResultJson {
        headline: status.headline(),
        exit_code: status.exit_code(),
        summary: summary(runs),
        gates_passed,
        gates_failed,
        gates_not_measured,
        failure: runs.iter().find_map(|r| r.run_failure.as_ref()),
    }
}

/// Gates passed, failed and not measured over `runs`.
fn count_gates(runs: &[Judged]) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for outcome in runs.iter().flat_map(|r| &r.outcomes) {
        match outcome.result {
            GateResult::Pass => counts.0 += 1,
            GateResult::Fail => counts.1 += 1,
            GateResult::NotMeasured => counts.2 += 1,
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::probe::client::ProbeRun;
    use crate::probe::gates::{evaluate, parse_gates};
    use crate::probe::stats::summarize;
    use crate::probe::stream::{StreamError, StreamRecord};

    /// A run of `n` steady streams of 40 token events 20 ms apart (SMOOTH), the first `failed`
    /// of them failed with a 401.
    fn run(n: u64, failed: u64) -> Report {
        let t0 = Instant::now();
        let streams = (0..n)
            .map(|i| {
                let mut s = StreamRecord::new(i, t0);
                if i < failed {
                    s.error = Some(StreamError::Status(401));
                    s.error_body = Some("{\"error\":\"bad key\"}".into());
                    return s;
                }
                let mut at = t0 + Duration::from_millis(30);
                for _ in 0..40 {
                    s.token_times.push(at);
                    at += Duration::from_millis(20);
                }
                s.counted_tokens = 40;
                s.finished = Some(at);
                s
            })
            .collect();
        let run = ProbeRun {
            started: t0,
            finished: t0 + Duration::from_secs(1),
            streams,
        };
        summarize(&run, Duration::from_millis(200))
    }

    fn judged(report: Report, gates: &str) -> Judged {
        let gates = parse_gates(&[gates]).unwrap();
        let outcomes = evaluate(&gates, &report, None);
        Judged::measured(None, report, outcomes, 0.05, false)
    }

    #[test]
    fn the_headline_is_the_verdict_only_when_every_gate_passed() {
        let passed = judged(run(4, 0), "errors==0");
        assert_eq!(passed.report.verdict, Verdict::Smooth);
        let status = Status::of(std::slice::from_ref(&passed));
        assert_eq!((status.headline(), status.exit_code()), ("SMOOTH", 0));
        assert_eq!(summary(&[passed]), "every gate passed (1)");

        let failed = judged(run(4, 0), "errors==0,itl_p99<1ms");
        let status = Status::of(std::slice::from_ref(&failed));
        assert_eq!((status.headline(), status.exit_code()), ("FAIL", 1));
        assert_eq!(
            summary(&[failed]),
            "1 of 2 gates failed: itl_p99<1ms; the verdict alone is SMOOTH"
        );
    }

    #[test]
    fn a_failed_run_is_an_error_with_the_servers_answer_as_its_cause() {
        let all_failed = judged(run(3, 3), "errors<1");
        let failure = all_failed.run_failure.clone().unwrap();
        assert_eq!(failure.kind, FailureKind::NoStreamCompleted);
        assert_eq!(failure.message, "no stream completed (3 of 3 failed)");
        assert_eq!(
            failure.causes,
            ["status (3): the server answered with status 401: {\"error\":\"bad key\"}"]
        );
        let status = Status::of(std::slice::from_ref(&all_failed));
        assert_eq!((status.headline(), status.exit_code()), ("ERROR", 3));
        let json = serde_json::to_value(all_failed.to_json()).unwrap();
        assert_eq!(json["result"]["headline"], "ERROR");
        assert_eq!(json["result"]["failure"]["kind"], "no_stream_completed");
        assert_eq!(json["gates"][0]["result"], "fail");
        assert_eq!(json["requests"], 3, "the report's own keys stay at the top");

        let some_failed = judged(run(10, 1), "");
        assert_eq!(
            some_failed.run_failure.map(|f| f.kind),
            Some(FailureKind::ErrorRate)
        );
        assert!(judged(run(40, 1), "").run_failure.is_none(), "2.5% < 5%");
    }

    #[test]
    fn a_run_that_never_took_place_measures_no_gate() {
        let gates = parse_gates(&["errors==0"]).unwrap();
        let failure = RunFailure {
            kind: FailureKind::Discovery,
            message: "no --model given, and none could be found".into(),
            causes: vec!["GET http://h/v1/models answered 401".into()],
        };
        let aborted = Judged::aborted(run(0, 0), &gates, failure);
        assert_eq!(aborted.gate_counts(), (0, 0, 1));
        let status = Status::of(std::slice::from_ref(&aborted));
        assert_eq!((status.headline(), status.exit_code()), ("ERROR", 3));
        assert_eq!(
            aborted.run_failure.as_ref().unwrap().one_line(),
            "no --model given, and none could be found: GET http://h/v1/models answered 401"
        );
        let json = serde_json::to_value(aborted.to_json()).unwrap();
        assert_eq!(json["gates"][0]["result"], "not_measured");
        assert_eq!(json["result"]["gates_not_measured"], 1);
        assert_eq!(json["result"]["failure"]["kind"], "discovery");
    }

    #[test]
    fn in_a_sweep_the_worst_run_decides() {
        let good = judged(run(4, 0), "errors==0");
        let bad = judged(run(4, 0), "itl_p99<1ms");
        let status = Status::of(&[good.clone(), bad]);
        assert_eq!(status, Status::GateFailed);
        let broken = judged(run(2, 2), "");
        assert_eq!(Status::of(&[good, broken]), Status::RunFailed);
    }
}
