//! The run's metadata (`meta` in the JSON): the tool's version, the command line, the URL, the
//! model, the load and the workload, the start and the wall time, so a report read months
//! later, or compared with another, says what produced it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::args::{Load, ProbeConfig, Stop};
use super::stats::{millis, RunMeta, Workload};

/// The metadata of a run of `config` that started at `started` and took `wall`.
pub fn run_meta(config: &ProbeConfig, started: SystemTime, wall: Duration) -> RunMeta {
    let (load, concurrency, rate) = match config.load {
        Load::Closed { concurrency } => ("closed", Some(concurrency), None),
        Load::Open {
            rate,
            max_in_flight,
        } => ("open", max_in_flight, Some(rate)),
    };
    RunMeta {
        version: env!("CARGO_PKG_VERSION"),
        command_line: command_line(std::env::args()),
        url: config.url.to_string(),
        model: config.model.clone(),
        load,
        concurrency,
        rate,
        started: rfc3339(started),
        duration_s: wall.as_secs_f64(),
        workload: workload(config),
    }
}

/// What `config` asks of the server beyond its load.
pub fn workload(config: &ProbeConfig) -> Workload {
    let (requests, duration_s) = match config.stop {
        Stop::Requests(n) => (Some(n), None),
        Stop::After(d) => (None, Some(d.as_secs_f64())),
    };
    Workload {
        requests,
        duration_s,
        request: config.shape.clone(),
        dataset_requests: (!config.bodies.is_empty()).then_some(config.bodies.len()),
        seed: config.seed,
        http2: config.http2,
        stall_threshold_ms: millis(config.stall_threshold),
    }
}

/// What the next argument holds, when it must not be kept as given.
#[derive(Clone, Copy, PartialEq)]
enum Next {
    /// An argument to keep.
    Kept,
    /// A `--header` value: kept up to its name.
    Header,
    /// An `--api-key` value: not kept at all.
    Key,
}

/// The command line with every `--header` / `-H` value cut to its name (`Authorization: ...`)
/// and the `--api-key` value masked: a report is shared, a token must not be.
pub fn command_line(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = Next::Kept;
    for arg in args {
        match std::mem::replace(&mut next, Next::Kept) {
            Next::Header => {
                out.push(mask(&arg));
                continue;
            }
            Next::Key => {
                out.push(super::secrets::MASK.to_owned());
                continue;
            }
            Next::Kept => {}
        }
        if arg == "-H" || arg == "--header" {
            out.push(arg);
            next = Next::Header;
        } else if arg == "--api-key" {
            out.push(arg);
            next = Next::Key;
        } else if arg.starts_with("--api-key=") {
            out.push(format!("--api-key={}", super::secrets::MASK));
        } else if let Some(value) = arg.strip_prefix("--header=") {
            out.push(format!("--header={}", mask(value)));
        } else if let Some(value) = arg.strip_prefix("-H").filter(|v| !v.is_empty()) {
            out.push(format!("-H{}", mask(value)));
        } else {
            out.push(arg);
        }
    }
    out
}

fn mask(header: &str) -> String {
    match header.split_once(':') {
        Some((name, _)) => format!("{}: ...", name.trim()),
        None => "...".to_owned(),
    }
}

/// `2026-12-02T08:10:00.123Z`.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z (a leap day).
        let at = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(at), "2024-02-29T12:34:56.789Z");
        let at = UNIX_EPOCH + Duration::from_secs(1_798_761_599);
        assert_eq!(rfc3339(at), "2026-12-31T23:59:59.000Z");
    }

    #[test]
    fn header_values_never_reach_the_report() {
        let args = [
            "metronome",
            "probe",
            "-H",
            "Authorization: Bearer sk-1",
            "--header=X-Key: k",
            "-HX-A: b",
            "--api-key",
            "sk-2",
            "--api-key=sk-3",
            "--url",
            "u",
        ];
        let line = command_line(args.map(String::from));
        assert_eq!(
            line,
            [
                "metronome",
                "probe",
                "-H",
                "Authorization: ...",
                "--header=X-Key: ...",
                "-HX-A: ...",
                "--api-key",
                "***",
                "--api-key=***",
                "--url",
                "u"
            ]
        );
    }
}
