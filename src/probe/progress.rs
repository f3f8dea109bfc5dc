//! Progress while a run goes: indicatif's bar on a terminal, and off a terminal (every CI runner,
//! every Kubernetes Job) one line every `--progress-interval` on stderr, so a 20-minute run in a
//! log does not look hung:
//!
//! `progress 12.0s: 40 done, 4 in flight, 1 failed, 812 token events, ITL p50 30.1ms p99 212.0ms`
//!
//! Both count the streams in flight (sent and not yet ended) beside the finished ones: a run of
//! long streams shows its load from the first second, not only when the first stream ends.

use crate::poison::LockExt;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::args::Stop;
use super::backoff::Starts;
use super::stats::nearest_rank;
use super::stream::StreamRecord;
use crate::units::format_duration;

/// What the progress line reports, updated as streams end.
#[derive(Debug, Default)]
struct Tally {
    done: u64,
    failed: u64,
    token_events: u64,
    /// Every gap so far, in microseconds (4 bytes a gap; sorted only when a line is printed;
    /// not kept for the bar, which shows no ITL).
    gaps_us: Vec<u32>,
}

/// How often the bar's count of streams in flight is brought up to date.
const BAR_REFRESH: Duration = Duration::from_millis(200);

/// The progress of one run: feed it every stream as it ends ([`Progress::stream_ended`]), and
/// [`Progress::finish`] it after the run.
pub struct Progress {
    bar: Option<ProgressBar>,
    tally: Arc<Mutex<Tally>>,
    /// Streams sent and ended, counted by the client.
    pub starts: Arc<Starts>,
    /// The task that prints the lines or refreshes the bar's counts.
    ticker: Option<tokio::task::JoinHandle<()>>,
}

// === impl Progress ===

impl Progress {
    /// A bar when stderr is a terminal; otherwise a line every `interval` (none for 0).
    pub fn start(stop: Stop, interval: Duration, label: String) -> Self {
        let terminal = std::io::stderr().is_terminal();
        Progress::start_on(stop, interval, label, terminal)
    }

    /// Like [`Progress::start`], saying whether stderr is a terminal.
    pub fn start_on(stop: Stop, interval: Duration, label: String, terminal: bool) -> Self {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let starts = Arc::new(Starts::default());
        if terminal {
            let bar = progress_bar(stop);
            let ticker = Some(tokio::spawn(refresh_bar(
                bar.clone(),
                tally.clone(),
                starts.clone(),
            )));
            return Progress {
                bar: Some(bar),
                tally,
                starts,
                ticker,
            };
        }
        let ticker = (!interval.is_zero()).then(|| {
            let (tally, starts) = (tally.clone(), starts.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut ticks =
                    tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
                loop {
                    ticks.tick().await;
                    let line = {
                        let mut tally = tally.lock_or_recover();
                        line(&label, started.elapsed(), starts.sent(), &mut tally)
                    };
                    eprintln!("{line}");
                }
            })
        });
        Progress {
            bar: None,
            tally,
            starts,
            ticker,
        }
    }

    /// Counts a stream that ended.
    pub fn stream_ended(&self, stream: &StreamRecord) {
        if self.ticker.is_none() {
            return;
        }
        let mut tally = self.tally.lock_or_recover();
        tally.done += 1;
        tally.failed += u64::from(stream.error.is_some());
        tally.token_events += stream.token_times.len() as u64;
        if let Some(bar) = &self.bar {
            bar.inc(1);
            return;
        }
        tally.gaps_us.extend(
            stream
                .gaps()
                .map(|g| u32::try_from(g.as_micros()).unwrap_or(u32::MAX)),
        );
    }

    /// Clears the bar or stops the lines.
    pub fn finish(self) {
        if let Some(ticker) = &self.ticker {
            ticker.abort();
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Keeps the bar's message (streams in flight, failed) up to date while the run goes.
async fn refresh_bar(bar: ProgressBar, tally: Arc<Mutex<Tally>>, starts: Arc<Starts>) {
    let mut ticks = tokio::time::interval(BAR_REFRESH);
    loop {
        ticks.tick().await;
        let message = {
            let tally = tally.lock_or_recover();
            format!(
                "{} in flight, {} failed",
                starts.sent().saturating_sub(tally.done),
                tally.failed
            )
        };
        bar.set_message(message);
    }
}

/// One progress line.
fn line(label: &str, elapsed: Duration, sent: u64, tally: &mut Tally) -> String {
    tally.gaps_us.sort_unstable();
    let at = |p| {
        nearest_rank(&tally.gaps_us, p).map_or_else(
            || "-".to_owned(),
            |us| format_duration(Duration::from_micros(u64::from(us))),
        )
    };
    format!(
        "progress{label} {}: {} done, {} in flight, {} failed, {} token events, ITL p50 {} p99 {}",
        format_duration(elapsed),
        tally.done,
        sent.saturating_sub(tally.done),
        tally.failed,
        tally.token_events,
        at(50),
        at(99)
    )
}

/// The terminal's bar.
fn progress_bar(stop: Stop) -> ProgressBar {
    let bar = match stop {
        Stop::Requests(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
        Stop::After(_) => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = match stop {
        Stop::Requests(_) => "{bar:40} {pos}/{len} streams done, {msg} {elapsed}",
        Stop::After(_) => "{spinner} {pos} streams done, {msg} {elapsed}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_done_in_flight_failed_events_and_itl() {
        let mut tally = Tally {
            done: 3,
            failed: 1,
            token_events: 40,
            gaps_us: vec![30_000, 10_000, 20_000, 300_000],
        };
        let text = line("", Duration::from_secs(12), 5, &mut tally);
        assert_eq!(
            text,
            "progress 12.00s: 3 done, 2 in flight, 1 failed, 40 token events, ITL p50 20.0ms p99 300.0ms"
        );
        let empty = line(
            " (rate 2/s)",
            Duration::from_secs(1),
            0,
            &mut Tally::default(),
        );
        assert!(
            empty.starts_with("progress (rate 2/s) 1.00s: 0 done, 0 in flight"),
            "{empty}"
        );
        assert!(empty.ends_with("ITL p50 - p99 -"), "{empty}");
    }
}
