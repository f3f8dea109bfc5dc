//! The `--timeline` file: the true send time of every frame as JSON lines, so a measurement made
//! elsewhere (proxy, probe) can be checked against what the sim really did.
//!
//! Streams hand records to a bounded channel and never wait: when the writer falls behind, the
//! record is dropped and counted, because a stream must not be slowed by the disk it is
//! measured with.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::stream::PhaseEvents;

/// Records that may wait for the writer before new ones are dropped.
const CHANNEL_RECORDS: usize = 64 * 1024;

/// One line of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// A request arrived and got sequence number `stream`.
    Request {
        /// The stream's sequence number (also the `x-sim-stream` header).
        stream: u64,
        /// The request's path.
        path: &'static str,
        /// Wall-clock microseconds at arrival.
        received_unix_us: u64,
    },
    /// A frame was handed to the connection.
    Frame {
        /// The stream's sequence number.
        stream: u64,
        /// Index (0-based) of the first token event in the frame, or of the next one if the
        /// frame carries none.
        event: u64,
        /// Token events in the frame.
        events: u32,
        /// The frame's token events by phase (`reasoning_events`, `content_events`,
        /// `tool_call_events`, each written when not 0; in that order within the frame).
        phases: PhaseEvents,
        /// Tokens in the frame.
        tokens: u32,
        /// Microseconds since the request arrived.
        t_us: u64,
        /// Wall-clock microseconds (arrival plus `t_us`, so both clocks agree).
        unix_us: u64,
        /// `--engine batch`: of the gap before this frame's token event, the time the shared
        /// loop was held by other requests' prefill (the batch's share; written when not 0).
        held_us: u64,
        /// Of the same gap, the stream's own stall (`--stall-prob`, `--stall-at`; written when
        /// not 0).
        stalled_us: u64,
        /// Of the same gap, the think pause (`--think-pause`; written when not 0).
        paused_us: u64,
    },
    /// `--engine batch`: a step of the shared loop prefilled part or all of a stream's prompt.
    Prefill {
        /// The stream's sequence number.
        stream: u64,
        /// The step (0-based).
        step: u64,
        /// Prompt tokens of this stream prefilled in the step.
        tokens: u64,
        /// What the step's prefill (of every stream) held it for.
        step_held_us: u64,
    },
}

/// The sending side, shared by every stream.
#[derive(Debug)]
pub(crate) struct Timeline {
    tx: mpsc::Sender<Record>,
    /// Records lost because the channel was full.
    dropped: AtomicU64,
}

/// The writer task and the means to stop it.
#[derive(Debug)]
pub(crate) struct TimelineWriter {
    close: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<u64>>,
}

// === impl Timeline ===

impl Timeline {
    /// Creates (truncates) the file at `path` and starts its writer task.
    pub(crate) async fn create(path: &Path) -> std::io::Result<(Arc<Timeline>, TimelineWriter)> {
        let file = tokio::fs::File::create(path).await?;
        let (tx, rx) = mpsc::channel(CHANNEL_RECORDS);
        let (close, closed) = oneshot::channel();
        let task = tokio::spawn(write_lines(file, rx, closed));
        let timeline = Arc::new(Timeline {
            tx,
            dropped: AtomicU64::new(0),
        });
        Ok((timeline, TimelineWriter { close, task }))
    }

    /// Queues a record without waiting; a full channel drops it and counts the loss.
    pub(crate) fn record(&self, record: Record) {
        if self.tx.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

// === impl TimelineWriter ===

impl TimelineWriter {
    /// Writes what is queued, flushes, and returns the number of lines written.
    pub(crate) async fn finish(self) -> std::io::Result<u64> {
        let _ = self.close.send(());
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// The writer task: one line per record, flushed whenever the queue runs dry.
async fn write_lines(
    file: tokio::fs::File,
    mut rx: mpsc::Receiver<Record>,
    mut closed: oneshot::Receiver<()>,
) -> std::io::Result<u64> {
    let mut out = tokio::io::BufWriter::new(file);
    let mut line = Vec::with_capacity(256);
    let mut written = 0u64;
    loop {
        let record = tokio::select! {
            record = rx.recv() => record,
            _ = &mut closed => None,
        };
        let Some(record) = record else { break };
        write_record(&mut out, &mut line, record).await?;
        written += 1;
        if rx.is_empty() {
            out.flush().await?;
        }
    }
    while let Ok(record) = rx.try_recv() {
        write_record(&mut out, &mut line, record).await?;
        written += 1;
    }
    out.flush().await?;
    Ok(written)
}

async fn write_record(
    out: &mut tokio::io::BufWriter<tokio::fs::File>,
    line: &mut Vec<u8>,
    record: Record,
) -> std::io::Result<()> {
    line.clear();
    format_record(line, record)?;
    out.write_all(line).await
}

/// Formats one JSON line (paths are the sim's own routes, so they need no escaping).
fn format_record(line: &mut Vec<u8>, record: Record) -> std::io::Result<()> {
    match record {
        Record::Request {
            stream,
            path,
            received_unix_us,
        } => writeln!(
            line,
            r#"{{"stream":{stream},"request":"{path}","received_unix_us":{received_unix_us}}}"#
        ),
        Record::Frame {
            stream,
            event,
            events,
            phases,
            tokens,
            t_us,
            unix_us,
            held_us,
            stalled_us,
            paused_us,
        } => {
            write!(
                line,
                r#"{{"stream":{stream},"event":{event},"events":{events},"tokens":{tokens},"t_us":{t_us},"unix_us":{unix_us}"#
            )?;
            let optional = [
                ("reasoning_events", u64::from(phases.reasoning)),
                ("content_events", u64::from(phases.content)),
                ("tool_call_events", u64::from(phases.tool_call)),
                ("held_us", held_us),
                ("stalled_us", stalled_us),
                ("paused_us", paused_us),
            ];
            for (key, value) in optional.into_iter().filter(|(_, v)| *v > 0) {
                write!(line, r#","{key}":{value}"#)?;
            }
            writeln!(line, "}}")
        }
        Record::Prefill {
            stream,
            step,
            tokens,
            step_held_us,
        } => writeln!(
            line,
            r#"{{"stream":{stream},"prefill_step":{step},"prefill_tokens":{tokens},"step_held_us":{step_held_us}}}"#
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_json_and_all_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timeline.jsonl");
        let (timeline, writer) = Timeline::create(&path).await.unwrap();
        timeline.record(Record::Request {
            stream: 1,
            path: "/v1/chat/completions",
            received_unix_us: 10,
        });
        for i in 0..100 {
            timeline.record(Record::Frame {
                stream: 1,
                event: i,
                events: 1,
                phases: PhaseEvents {
                    reasoning: u32::from(i < 10),
                    content: u32::from(i >= 10),
                    tool_call: 0,
                },
                tokens: 1,
                t_us: 1000 * i,
                unix_us: 10 + 1000 * i,
                held_us: 0,
                stalled_us: i,
                paused_us: if i == 10 { 500_000 } else { 0 },
            });
        }
        assert_eq!(writer.finish().await.unwrap(), 101);
        assert_eq!(timeline.dropped(), 0);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 101);
        assert_eq!(lines[0]["request"], "/v1/chat/completions");
        assert_eq!(lines[100]["t_us"], 99_000);
        assert_eq!(lines[100]["stalled_us"], 99);
        assert!(lines[100].get("held_us").is_none(), "0 is not written");
        assert!(lines[1].get("stalled_us").is_none());
        assert_eq!(lines[10]["reasoning_events"], 1);
        assert!(lines[10].get("content_events").is_none());
        assert_eq!(lines[11]["content_events"], 1);
        assert_eq!(lines[11]["paused_us"], 500_000);
        assert!(lines[12].get("paused_us").is_none());
    }
}
