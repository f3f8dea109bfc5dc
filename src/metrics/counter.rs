//! Counters whose series carry an exemplar: OpenMetrics writes it on the `_total` sample,
//! protobuf in `Counter.exemplar` (client_model's `metrics.proto`, field 2).
//!
//! The `prometheus` crate's counters have no exemplar field. A [`CounterFamily`] keeps its values
//! in an `IntCounterVec` registered exactly as a plain counter is (so the text format 0.0.4 is
//! byte for byte what it was) and, beside it, one exemplar slot per series behind a mutex. It is
//! meant for counters of rare events (hitches, episodes), counted off the frame path: an
//! increment takes the lock, nothing per frame does.
//!
//! Which exemplar a slot shows: the largest `rank` offered since the last scrape that showed
//! exemplars, then the first offered after that scrape, as a stall bucket keeps its longest
//! stall (`ExemplarPolicy::LargestSinceScrape`), so the worst event between two scrapes is the
//! one Prometheus sees.
//!
//! The exemplar's value is the increment, 1. OpenMetrics 1.0 lets a counter's Total carry an
//! exemplar and requires only a label set and a value; the client libraries write the increment
//! there (client_golang's `AddWithExemplar(v, …)`, client_python's `inc(amount, exemplar=…)`).
//! The event's own size (a hitch's gap) ranks the candidates instead of being the value, so a
//! query that sums exemplar values over a window still counts events.

use crate::poison::LockExt;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts};

use super::histogram::StoredExemplar;

/// Adds `n` to `counter`, stopping at `u64::MAX` rather than wrapping past it: a counter that
/// wraps goes down, which Prometheus reads as a reset. The `prometheus` crate's `inc_by` is a
/// plain `fetch_add`; the room is read first, so two additions racing at the very top could
/// still pass it, which every figure's own bound (`metering::usage`) keeps out of reach.
pub fn add_saturating(counter: &prometheus::IntCounter, n: u64) {
    counter.inc_by(n.min(u64::MAX - counter.get()));
}

/// The value a counter's exemplar shows: the increment of the event it names.
pub const COUNTER_EXEMPLAR_VALUE: f64 = 1.0;

/// The event an increment counts, offered as the series' exemplar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterExemplar<'a> {
    /// The `x-metronome-stream-id` of the stream it names (resolves at `/streams/{id}` while the
    /// stream is retained).
    pub stream_id: &'a str,
    /// The trace ID of that stream's `traceparent`, when it had one.
    pub trace_id: Option<&'a str>,
    /// How large the event was (a hitch's gap in seconds, say): the largest since the last
    /// scrape is kept. Not shown.
    pub rank: f64,
}

/// A counter family whose series each keep an exemplar.
#[derive(Debug, Clone)]
pub struct CounterFamily {
    counter: IntCounterVec,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    label_names: Vec<String>,
    slots: Mutex<Vec<Slot>>,
}

/// One series' exemplar.
#[derive(Debug)]
struct Slot {
    label_values: Box<[Box<str>]>,
    rank: f64,
    exemplar: StoredExemplar,
    /// A scrape has shown it: the next offer replaces it whatever its rank.
    shown: bool,
}

/// The exemplars of a [`CounterFamily`] at one scrape, for the encoders.
#[derive(Debug, Clone, Default)]
pub struct CounterExemplars {
    label_names: Vec<String>,
    slots: Vec<(Vec<String>, StoredExemplar)>,
}

// === impl CounterFamily ===

impl CounterFamily {
    /// A counter family `name` (ending in `_total`, as the `prometheus` crate names counters)
    /// with these labels; register it with [`super::Metrics::register_counter`].
    pub fn new(name: &str, help: &str, label_names: &[&str]) -> prometheus::Result<Self> {
        let counter = IntCounterVec::new(Opts::new(name, help), label_names)?;
        Ok(CounterFamily {
            counter,
            inner: Arc::new(Inner {
                name: name.to_owned(),
                label_names: label_names.iter().map(|l| (*l).to_owned()).collect(),
                slots: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The family's name, as the registry gathers it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The counters themselves, for the registry (text 0.0.4) and for reading values.
    pub fn counter(&self) -> &IntCounterVec {
        &self.counter
    }

    /// The collector to register: the plain counters, which the text format encodes as before.
    pub(crate) fn collector(&self) -> Box<dyn Collector> {
        Box::new(self.counter.clone())
    }

    /// Counts one event in the series with these label values (bounded sets only) and offers
    /// `exemplar` to its slot. One lock of the family's slots; it allocates only for a new series
    /// or a stream that replaces another's exemplar.
    pub fn inc(&self, label_values: &[&str], exemplar: Option<&CounterExemplar<'_>>) {
        self.counter.with_label_values(label_values).inc();
        let Some(offered) = exemplar else {
            return;
        };
        let mut slots = self.inner.slots.lock_or_recover();
        let found = slots.iter_mut().find(|slot| {
            slot.label_values.len() == label_values.len()
                && slot
                    .label_values
                    .iter()
                    .zip(label_values)
                    .all(|(kept, value)| **kept == **value)
        });
        let Some(slot) = found else {
            slots.push(Slot {
                label_values: label_values.iter().map(|v| Box::from(*v)).collect(),
                rank: offered.rank,
                exemplar: StoredExemplar::now(
                    COUNTER_EXEMPLAR_VALUE,
                    offered.stream_id,
                    offered.trace_id,
                ),
                shown: false,
            });
            return;
        };
        if !(slot.shown || offered.rank >= slot.rank) {
            return;
        }
        let fresh =
            StoredExemplar::now(COUNTER_EXEMPLAR_VALUE, offered.stream_id, offered.trace_id);
        slot.rank = offered.rank;
        slot.shown = false;
        if *slot.exemplar.stream_id == *offered.stream_id {
            // The same stream again: its IDs are kept in place.
            slot.exemplar.timestamp = fresh.timestamp;
        } else {
            slot.exemplar = fresh;
        }
    }

    /// Every series' exemplar now. With `showing` they count as seen, so the next offer to each
    /// slot replaces it whatever its rank.
    pub fn exemplars(&self, showing: bool) -> CounterExemplars {
        let mut slots = self.inner.slots.lock_or_recover();
        CounterExemplars {
            label_names: self.inner.label_names.clone(),
            slots: slots
                .iter_mut()
                .map(|slot| {
                    slot.shown |= showing;
                    (
                        slot.label_values.iter().map(|v| v.to_string()).collect(),
                        slot.exemplar.clone(),
                    )
                })
                .collect(),
        }
    }
}

// === impl CounterExemplars ===

impl CounterExemplars {
    /// The exemplar of the series with these `(name, value)` labels (in any order, as the
    /// registry gathers them), if it has one.
    pub fn of(&self, labels: &[(String, String)]) -> Option<&StoredExemplar> {
        self.of_series(|name| {
            labels
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        })
    }

    /// The exemplar of the series with these labels as the registry gathered them (in any
    /// order), if it has one: [`CounterExemplars::of`] without copying the labels.
    pub fn of_pairs(&self, labels: &[prometheus::proto::LabelPair]) -> Option<&StoredExemplar> {
        self.of_series(|name| labels.iter().find(|l| l.name() == name).map(|l| l.value()))
    }

    /// The exemplar of the series whose every label `value_of` gives as the slot holds it: the
    /// one lookup behind both label forms (read at a scrape, never per event).
    fn of_series<'l>(&self, value_of: impl Fn(&str) -> Option<&'l str>) -> Option<&StoredExemplar> {
        self.slots
            .iter()
            .find(|(values, _)| {
                values.len() == self.label_names.len()
                    && self
                        .label_names
                        .iter()
                        .zip(values)
                        .all(|(name, value)| value_of(name) == Some(value.as_str()))
            })
            .map(|(_, exemplar)| exemplar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_stops_at_the_top_instead_of_wrapping() {
        let counter = prometheus::IntCounter::new("c", "c").unwrap();
        add_saturating(&counter, 10);
        add_saturating(&counter, u64::MAX);
        assert_eq!(counter.get(), u64::MAX);
        add_saturating(&counter, 1);
        assert_eq!(counter.get(), u64::MAX);
    }

    fn offer(family: &CounterFamily, scope: &str, stream_id: &str, rank: f64) {
        family.inc(
            &["chat", scope],
            Some(&CounterExemplar {
                stream_id,
                trace_id: None,
                rank,
            }),
        );
    }

    fn shown(family: &CounterFamily, scope: &str, showing: bool) -> Option<String> {
        let labels = [
            ("scope".to_owned(), scope.to_owned()),
            ("route".to_owned(), "chat".to_owned()),
        ];
        family
            .exemplars(showing)
            .of(&labels)
            .map(|e| e.stream_id.to_string())
    }

    fn family() -> CounterFamily {
        CounterFamily::new("hitches_total", "Hitches.", &["route", "scope"]).unwrap()
    }

    #[test]
    fn a_series_keeps_its_largest_exemplar_until_a_scrape_shows_it() {
        let family = family();
        offer(&family, "stream", "a", 0.3);
        offer(&family, "stream", "b", 0.9);
        offer(&family, "stream", "c", 0.5);
        assert_eq!(shown(&family, "stream", false).as_deref(), Some("b"));
        // Shown by a scrape: the next offer replaces it, smaller or not.
        assert_eq!(shown(&family, "stream", true).as_deref(), Some("b"));
        offer(&family, "stream", "d", 0.1);
        assert_eq!(shown(&family, "stream", true).as_deref(), Some("d"));
        // Each series has its own slot, and its value is the increment.
        offer(&family, "batch", "e", 0.05);
        assert_eq!(shown(&family, "batch", false).as_deref(), Some("e"));
        assert_eq!(shown(&family, "stream", false).as_deref(), Some("d"));
        let labels = [
            ("route".to_owned(), "chat".to_owned()),
            ("scope".to_owned(), "batch".to_owned()),
        ];
        let exemplars = family.exemplars(false);
        let exemplar = exemplars.of(&labels).unwrap();
        assert_eq!(exemplar.value, COUNTER_EXEMPLAR_VALUE);
        assert!(exemplar.timestamp > 1.0e9, "a Unix time");
    }

    #[test]
    fn every_increment_counts_with_or_without_an_exemplar() {
        let family = family();
        offer(&family, "stream", "a", 0.3);
        family.inc(&["chat", "stream"], None);
        offer(&family, "stream", "a", 0.4);
        assert_eq!(
            family
                .counter()
                .with_label_values(&["chat", "stream"])
                .get(),
            3
        );
        assert_eq!(shown(&family, "batch", false), None);
        assert_eq!(shown(&family, "stream", false).as_deref(), Some("a"));
    }
}
