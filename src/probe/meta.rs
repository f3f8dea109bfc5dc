//! The run's metadata (`meta` in the JSON): the tool's version, the command line, the URL, the
//! model, the load, the start and the wall time, so a report read months later, or compared
//! with another, says what produced it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::args::{Load, ProbeConfig};
use super::stats::RunMeta;

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
    }
}

/// The command line with every `--header` / `-H` value cut to its name (`Authorization: ...`):
/// a report is shared, a token must not be.
pub fn command_line(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut header_next = false;
    for arg in args {
        if header_next {
            out.push(mask(&arg));
            header_next = false;
        } else if arg == "-H" || arg == "--header" {
            out.push(arg);
            header_next = true;
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
                "--url",
                "u"
            ]
        );
    }
}
