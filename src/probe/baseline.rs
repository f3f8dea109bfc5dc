//! Baselines: `--baseline main.json` and `metronome probe compare a.json b.json`. A baseline is
//! an earlier `--json` report read back as JSON, so any version's report can be compared as long
//! as it has the keys; a key it lacks shows as `-`.

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
