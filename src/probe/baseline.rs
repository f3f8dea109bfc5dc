//! Baselines: `--baseline main.json` and `metronome probe compare a.json b.json`. A baseline is
//! an earlier `--json` report read back as JSON, so any version's report can be compared as long
//! as it has the keys; a key it lacks shows as `-`. Both warn when the two runs' workloads differ
//! (the `meta` keys of [`WORKLOAD_KEYS`]): their deltas then measure the change of workload too.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use super::gates::Metric;

/// The metrics a comparison shows, in order.
pub const COMPARED: [Metric; 13] = [
    Metric::TtftP50,
    Metric::TtftP99,
    Metric::ItlP50,
    Metric::ItlP99,
    Metric::ItlMax,
    Metric::TpsP50,
    Metric::TpsP5,
    Metric::StallPct,
    Metric::Jank,
    Metric::Errors,
    Metric::Goodput,
    Metric::Rps,
    Metric::OutputTps,
];

/// Where in `meta` the workload is recorded, each key compared between two reports. The URL,
/// the model and the number of streams are not: they are what a comparison is usually for, or
/// change only the sample's size.
pub const WORKLOAD_KEYS: [&[&str]; 12] = [
    &["load"],
    &["concurrency"],
    &["rate"],
    &["workload", "max_tokens"],
    &["workload", "ignore_eos"],
    &["workload", "input_tokens"],
    &["workload", "dataset"],
    &["workload", "dataset_requests"],
    &["workload", "seed"],
    &["workload", "body"],
    &["workload", "http2"],
    &["workload", "stall_threshold_ms"],
];

/// A report that cannot be read as a baseline: a usage error.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// The file could not be read.
    #[error("cannot read the report {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a probe report.
    #[error("{path} is not a probe --json report: {reason}")]
    NotAReport {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// One row of a comparison: the metric, its value in A and in B.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delta {
    /// What is compared.
    pub metric: Metric,
    /// In the earlier report.
    pub a: Option<f64>,
    /// In the later report.
    pub b: Option<f64>,
}

/// Reads a `--json` report (a single run; a `--rate-sweep` report has no single value per metric).
pub fn load(path: &Path) -> Result<serde_json::Value, BaselineError> {
    let text = std::fs::read(path).map_err(|source| BaselineError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let not = |reason: String| BaselineError::NotAReport {
        path: path.to_owned(),
        reason,
    };
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| not(e.to_string()))?;
    if value.get("sweep").is_some() {
        return Err(not(
            "it is a --rate-sweep report (compare single runs)".into()
        ));
    }
    if value.get("itl_ms").is_none() || value.get("requests").is_none() {
        return Err(not("it has no `requests` and `itl_ms`".into()));
    }
    Ok(value)
}

/// The rows comparing `a` with `b`.
pub fn deltas(a: &serde_json::Value, b: &serde_json::Value) -> Vec<Delta> {
    COMPARED
        .iter()
        .map(|&metric| Delta {
            metric,
            a: metric.from_json(a),
            b: metric.from_json(b),
        })
        .collect()
}

/// Each way the workloads of `a` and `b` differ, as `concurrency 8 against 16`. A key either
/// report lacks (an older report, or one without `meta`) is not compared.
pub fn workload_differences(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let at = |report: &serde_json::Value, path: &[&str]| {
        path.iter()
            .try_fold(report.get("meta")?, |v, key| v.get(key))
            .cloned()
    };
    WORKLOAD_KEYS
        .iter()
        .filter_map(|path| {
            let (x, y) = (at(a, path)?, at(b, path)?);
            (x != y).then(|| format!("{} {x} against {y}", path.join(".")))
        })
        .collect()
}

/// The warning for `differences` between the runs named `a` and `b` (`None` when there are
/// none).
pub fn workload_warning(a: &str, b: &str, differences: &[String]) -> Option<String> {
    (!differences.is_empty()).then(|| {
        format!(
            "the workloads of {a} and {b} differ, so the deltas measure that too: {}",
            differences.join(", ")
        )
    })
}

// === impl Delta ===

impl Delta {
    /// `+12.3%` (B against A), `-` when either is missing or A is 0.
    pub fn percent(&self) -> String {
        match (self.a, self.b) {
            (Some(a), Some(b)) if a != 0.0 => format!("{:+.1}%", (b - a) / a * 100.0),
            (Some(a), Some(b)) if a == b => "+0.0%".to_owned(),
            _ => "-".to_owned(),
        }
    }

    /// The change B - A in the metric's unit (`+3.1ms`, `-0.50`).
    pub fn change(&self) -> String {
        match (self.a, self.b) {
            (Some(a), Some(b)) => {
                let sign = if b < a { '-' } else { '+' };
                format!("{sign}{}", self.metric.format((b - a).abs()))
            }
            _ => "-".to_owned(),
        }
    }

    fn side(&self, value: Option<f64>) -> String {
        value.map_or_else(|| "-".to_owned(), |v| self.metric.format(v))
    }
}

/// The comparison as aligned text: metric, A, B, change, percent.
pub fn render_text(a_name: &str, b_name: &str, rows: &[Delta]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:>14} {:>14} {:>12} {:>9}",
        "metric", a_name, b_name, "change", "%"
    );
    for row in rows {
        let _ = writeln!(
            out,
            "{:<12} {:>14} {:>14} {:>12} {:>9}",
            row.metric.name(),
            row.side(row.a),
            row.side(row.b),
            row.change(),
            row.percent()
        );
    }
    out
}

/// The comparison as a Markdown table.
pub fn render_markdown(a_name: &str, b_name: &str, rows: &[Delta]) -> String {
    let mut out =
        format!("| metric | {a_name} | {b_name} | change | % |\n|---|---:|---:|---:|---:|\n");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.metric.name(),
            row.side(row.a),
            row.side(row.b),
            row.change(),
            row.percent()
        );
    }
    out
}

/// Trims a path to its file name for a column header.
pub fn short_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deltas_show_changes_and_percentages() {
        let a = json!({"requests": 10, "errors": 0, "itl_ms": {"p99": 100.0}, "tokens_per_second": {"p50": 40.0}});
        let b = json!({"requests": 10, "errors": 2, "itl_ms": {"p99": 150.0}, "tokens_per_second": {"p50": 30.0}});
        let rows = deltas(&a, &b);
        let itl = rows.iter().find(|r| r.metric == Metric::ItlP99).unwrap();
        assert_eq!(
            (itl.change(), itl.percent()),
            ("+50.0ms".to_owned(), "+50.0%".to_owned())
        );
        let tps = rows.iter().find(|r| r.metric == Metric::TpsP50).unwrap();
        assert_eq!(
            (tps.change(), tps.percent()),
            ("-10.00".to_owned(), "-25.0%".to_owned())
        );
        let errors = rows.iter().find(|r| r.metric == Metric::Errors).unwrap();
        assert_eq!(
            (errors.change(), errors.percent()),
            ("+2".to_owned(), "-".to_owned())
        );
        let text = render_text("a.json", "b.json", &rows);
        assert!(
            text.lines().any(|l| l.starts_with("itl_p99")
                && l.contains("100.0ms")
                && l.contains("150.0ms")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("goodput") && l.contains(" - ")),
            "{text}"
        );
        let md = render_markdown("a", "b", &rows);
        assert!(
            md.contains("| itl_p99 | 100.0ms | 150.0ms | +50.0ms | +50.0% |"),
            "{md}"
        );
    }

    #[test]
    fn differing_workloads_are_named_and_missing_keys_are_not() {
        let a = json!({"meta": {"load": "closed", "concurrency": 8, "rate": null, "url": "a",
            "workload": {"max_tokens": 64, "dataset": null, "requests": 10, "http2": false}}});
        let b = json!({"meta": {"load": "closed", "concurrency": 16, "rate": null, "url": "b",
            "workload": {"max_tokens": 200, "dataset": "d.jsonl", "requests": 99, "http2": false}}});
        assert_eq!(
            workload_differences(&a, &b),
            [
                "concurrency 8 against 16",
                "workload.max_tokens 64 against 200",
                "workload.dataset null against \"d.jsonl\""
            ]
        );
        assert!(workload_differences(&a, &a).is_empty());
        // A report from before `meta.workload`, or without `meta`, compares what it has.
        let old = json!({"meta": {"load": "closed", "concurrency": 8}});
        assert!(workload_differences(&old, &a).is_empty());
        assert!(workload_differences(&json!({}), &b).is_empty());
        let warning = workload_warning("main.json", "this run", &workload_differences(&a, &b));
        assert!(
            warning.unwrap().starts_with(
                "the workloads of main.json and this run differ, so the deltas measure that too: concurrency 8 against 16, "
            )
        );
        assert_eq!(workload_warning("a", "b", &[]), None);
    }

    #[test]
    fn only_single_run_reports_are_baselines() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "{\"sweep\": []}").unwrap();
        assert!(matches!(
            load(file.path()),
            Err(BaselineError::NotAReport { .. })
        ));
        std::fs::write(file.path(), "not json").unwrap();
        assert!(matches!(
            load(file.path()),
            Err(BaselineError::NotAReport { .. })
        ));
        std::fs::write(file.path(), "{\"requests\": 1, \"itl_ms\": {}}").unwrap();
        assert!(load(file.path()).is_ok());
        assert!(matches!(
            load(Path::new("/nonexistent/a.json")),
            Err(BaselineError::Unreadable { .. })
        ));
    }
}
