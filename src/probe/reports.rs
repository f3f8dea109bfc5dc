//! Writes every report file asked for (`--json`, `--detail`, `--html`, `--junit`, `--markdown`,
//! `--gaps-csv`) from one [`Outcome`], whichever way the run ended: passed, a gate failed, every
//! stream failed, no model was found, or the command line was refused. So a CI page always has
//! the files it was told to expect, and each says what the exit code says.

use std::path::Path;

use super::args::OutputArgs;
use super::attribution::{gaps_csv, GapRow};
use super::client::ProbeRun;
use super::judged::{result_json, Judged};
use super::stats::detail_json;
use super::{report_ci, report_html};

/// Everything the report files are written from.
pub struct Outcome {
    /// Each run (one, or one per rate of a sweep) and what was decided about it.
    pub judged: Vec<Judged>,
    /// The streams of the last run, for the HTML report (none recorded when nothing ran).
    pub run: ProbeRun,
    /// One line saying what was probed and how.
    pub describe: String,
    /// The comparison with `--baseline`, as Markdown.
    pub baseline_table: Option<String>,
    /// Every matched gap of `--join`, for `--gaps-csv`.
    pub gap_rows: Option<Vec<GapRow>>,
}

/// A report that could not be written: a usage error (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The report could not be serialized.
    #[error("cannot write the JSON report: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes every report `out` asks for. Each is attempted even when an earlier one failed; the
/// first failure is returned.
pub fn write_all(out: &OutputArgs, outcome: &Outcome) -> Result<(), ReportError> {
    let mut first = None;
    let mut keep = |result: Result<(), ReportError>| {
        if let Err(e) = result {
            first.get_or_insert(e);
        }
    };
    let single = match outcome.judged.as_slice() {
        [one] => Some(one),
        _ => None,
    };
    if let Some(path) = &out.json {
        keep(json(&outcome.judged).and_then(|text| write_file(path, &text)));
    }
    if let (Some(path), Some(one)) = (&out.detail, single) {
        keep(
            serde_json::to_string_pretty(&detail_json(&one.report))
                .map_err(ReportError::from)
                .and_then(|text| write_file(path, &(text + "\n"))),
        );
    }
    if let (Some(path), Some(one)) = (&out.html, single) {
        let admin = out.join.as_deref();
        let html = report_html::render_html_judged(&outcome.run, one, &outcome.describe, admin);
        keep(write_file(path, &html));
    }
    if let Some(path) = &out.junit {
        keep(write_file(path, &report_ci::render_junit(&outcome.judged)));
    }
    if let Some(path) = &out.markdown {
        let baseline = outcome.baseline_table.as_deref();
        let text = report_ci::render_markdown(&outcome.describe, &outcome.judged, baseline);
        keep(write_file(path, &text));
        if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()) {
            keep(append_file(Path::new(&summary), &text));
        }
    }
    if let (Some(path), Some(rows)) = (&out.gaps_csv, &outcome.gap_rows) {
        keep(write_file(path, &gaps_csv(rows)));
    }
    first.map_or(Ok(()), Err)
}

/// The JSON report: one run's keys with its `gates` and `result`, or for a sweep a row per rate
/// (each with its `rate`) and the `result` of them all.
fn json(judged: &[Judged]) -> Result<String, ReportError> {
    let value = match judged {
        [one] => serde_json::to_value(one.to_json())?,
        runs => {
            let rows = runs
                .iter()
                .map(|j| {
                    let mut row = serde_json::to_value(j.to_json())?;
                    if let (Some(meta), Some(object)) = (&j.report.meta, row.as_object_mut()) {
                        object.insert("rate".to_owned(), serde_json::json!(meta.rate));
                    }
                    Ok(row)
                })
                .collect::<Result<Vec<_>, serde_json::Error>>()?;
            serde_json::json!({ "sweep": rows, "result": result_json(runs) })
        }
    };
    Ok(serde_json::to_string_pretty(&value)? + "\n")
}

fn write_file(path: &Path, contents: &str) -> Result<(), ReportError> {
    std::fs::write(path, contents).map_err(|source| ReportError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Appends to a file (the GitHub step summary collects every step's Markdown).
fn append_file(path: &Path, contents: &str) -> Result<(), ReportError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|source| ReportError::Write {
            path: path.display().to_string(),
            source,
        })
}
