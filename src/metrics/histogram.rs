//! Histograms that a whole stream's samples can be merged into at once.
//!
//! The `prometheus` crate's histograms take one sample at a time through shared atomics. A stream
//! instead gathers its samples in a [`LocalHistogram`] (a fixed array, no atomics, no allocation)
//! and merges it into the shared [`HistogramFamily`] exactly once, when the stream is recorded.
//! That keeps the per-frame path free of shared cache lines and label lookups, and makes "a stream
//! is recorded exactly once" literally true of every histogram.

use crate::poison::{LockExt, RwLockExt};
use std::cmp::Ordering as Compared;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};
use prometheus::proto;

use super::native::{NativeCounts, NativeIndex, NativeSettings, NativeState};

/// The most bucket boundaries a histogram may have (the config refuses more).
pub const MAX_BOUNDS: usize = 32;

/// Per-stream samples of one histogram: counts per bucket (the last one is `+Inf`), sum and count.
#[derive(Debug, Clone, Default)]
pub struct LocalHistogram {
    buckets: BucketCounts,
    sum: f64,
    count: u64,
}

// === impl LocalHistogram ===

impl LocalHistogram {
    /// Adds one sample; `bounds` are the family's upper bounds (`le`), ascending.
    #[inline]
    pub fn observe(&mut self, bounds: &[f64], value: f64) {
        self.observe_n(bounds, value, 1);
    }

    /// Adds one sample whose bucket the caller found already (see
    /// [`crate::sketch::GapHistogramIndex`]): the number of the family's bounds below `value`.
    #[inline]
    pub fn observe_in(&mut self, bucket: usize, value: f64) {
        self.buckets.add_at(bucket, 1);
        self.sum += value;
        self.count += 1;
    }

    /// Adds `n` samples of the same value (a clump of zero gaps, for instance).
    #[inline]
    pub fn observe_n(&mut self, bounds: &[f64], value: f64, n: u32) {
        if n == 0 {
            return;
        }
        self.buckets.add(bounds, value, n);
        self.sum += value * f64::from(n);
        self.count += u64::from(n);
    }

    /// The samples whose bucket counts are `counts`, with the `sum` and `count` their owner kept.
    pub fn from_counts(counts: &BucketCounts, sum: f64, count: u64) -> Self {
        LocalHistogram {
            buckets: counts.clone(),
            sum,
            count,
        }
    }

    /// How many samples were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of the samples.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// A [`LocalHistogram`]'s bucket counts alone, for a histogram whose owner knows its sum and
/// count without adding them up sample by sample. A stream's inter-token gaps are one: they run
/// from its first token event to its last, so their sum is that span and their count is the token
/// events but one. A sample then writes one counter and nothing else, and at 1,000 open streams,
/// where a stream's state is out of the cache by its next frame, the sum and count would be one
/// more cache line to fetch per sample.
#[derive(Debug, Clone)]
pub struct BucketCounts {
    counts: [u32; MAX_BOUNDS + 1],
}

impl Default for BucketCounts {
    fn default() -> Self {
        BucketCounts {
            counts: [0; MAX_BOUNDS + 1],
        }
    }
}

// === impl BucketCounts ===

impl BucketCounts {
    /// Counts `n` samples of `value` in its bucket; `bounds` are the family's upper bounds.
    #[inline]
    pub fn add(&mut self, bounds: &[f64], value: f64, n: u32) {
        if n == 0 {
            return;
        }
        self.add_at(bounds.partition_point(|b| *b < value), n);
    }

    /// Counts `n` samples in bucket `bucket`, for a caller that found it already (see
    /// [`crate::sketch::GapHistogramIndex`]): the number of bounds below the value.
    #[inline]
    pub fn add_at(&mut self, bucket: usize, n: u32) {
        self.counts[bucket] = self.counts[bucket].saturating_add(n);
    }
}

/// One labelled series of a [`HistogramFamily`].
#[derive(Debug)]
struct Series {
    label_values: Vec<String>,
    /// Non-cumulative counts per bucket, the last one `+Inf`.
    counts: Box<[AtomicU64]>,
    /// The sum, as `f64` bits, updated by compare-and-swap.
    sum_bits: AtomicU64,
    count: AtomicU64,
    /// When the series was made, seconds since the Unix epoch (OpenMetrics' `_created`).
    created: f64,
    /// The native buckets and the exemplars: taken once per merge (a stream's flush), never per
    /// sample; `None` for a family with neither.
    extra: Option<Mutex<Extra>>,
}

/// What a series keeps beside its classic counts, under one lock.
#[derive(Debug)]
struct Extra {
    native: Option<NativeState>,
    /// Per classic bucket (`+Inf` last), its exemplar; empty when the family keeps none.
    exemplars: Box<[Option<StoredExemplar>]>,
}

/// The stream a sample came from, to hang on its bucket as an exemplar: the stream's ID (it
/// resolves at the admin `/streams/{id}` while the stream is retained) and its W3C trace ID when
/// the request had a `traceparent`. `value` is the sample the exemplar shows (a flush of many
/// samples passes one of them, its longest gap for instance); it picks the bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exemplar<'a> {
    /// The `x-metronome-stream-id` value.
    pub stream_id: &'a str,
    /// The trace ID of the request's `traceparent` (32 hex digits), if it had one.
    pub trace_id: Option<&'a str>,
    /// The sample shown.
    pub value: f64,
}

/// Which exemplar a bucket keeps when several streams offer one between two scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExemplarPolicy {
    /// The family keeps no exemplars.
    #[default]
    None,
    /// The latest offered.
    Latest,
    /// The largest value offered since the last scrape that showed exemplars (stalls: the worst
    /// one must survive until Prometheus has seen it), then the latest after it.
    LargestSinceScrape,
}

/// An exemplar as a bucket keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredExemplar {
    /// The sample.
    pub value: f64,
    /// The stream's ID (a `String`, so that the next stream's ID reuses its buffer).
    pub stream_id: String,
    /// Its trace ID, if known.
    pub trace_id: Option<String>,
    /// When it was offered, seconds since the Unix epoch.
    pub timestamp: f64,
    /// A scrape has shown it.
    scraped: bool,
}

// === impl StoredExemplar ===

impl StoredExemplar {
    /// An exemplar offered now, not yet shown by a scrape (for the counters' slots, which keep
    /// their own "shown" mark beside it).
    pub(crate) fn now(value: f64, stream_id: &str, trace_id: Option<&str>) -> Self {
        StoredExemplar {
            value,
            stream_id: stream_id.into(),
            trace_id: trace_id.map(Into::into),
            timestamp: unix_now(),
            scraped: false,
        }
    }

    /// Puts `exemplar` in this one's place, in its buffers: a bucket's exemplar changes streams
    /// on most requests, and two new strings per offer were most of the allocations a request's
    /// histograms made. The same stream offering again (each live flush does) writes no text.
    fn take_over(&mut self, exemplar: &Exemplar<'_>) {
        self.value = exemplar.value;
        if self.stream_id != exemplar.stream_id {
            self.stream_id.clear();
            self.stream_id.push_str(exemplar.stream_id);
        }
        match (exemplar.trace_id, &mut self.trace_id) {
            (Some(new), Some(kept)) => {
                if kept != new {
                    kept.clear();
                    kept.push_str(new);
                }
            }
            (new, kept) => *kept = new.map(Into::into),
        }
        self.timestamp = unix_now();
        self.scraped = false;
    }
}

/// How a family is kept beyond its classic buckets.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FamilyOptions {
    /// Native buckets beside the classic ones, with these settings.
    pub native: Option<NativeSettings>,
    /// Exemplars on the classic buckets.
    pub exemplars: ExemplarPolicy,
}

/// Now, in seconds since the Unix epoch (an exemplar's timestamp).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

// === impl Extra ===

impl Extra {
    fn offer(&mut self, bucket: usize, exemplar: &Exemplar<'_>, policy: ExemplarPolicy) {
        let Some(slot) = self.exemplars.get_mut(bucket) else {
            return;
        };
        let replace = match (policy, &*slot) {
            (ExemplarPolicy::None, _) => false,
            (_, None) | (ExemplarPolicy::Latest, _) => true,
            (ExemplarPolicy::LargestSinceScrape, Some(old)) => {
                old.scraped || exemplar.value >= old.value
            }
        };
        if !replace {
            return;
        }
        match slot {
            Some(old) => old.take_over(exemplar),
            None => {
                *slot = Some(StoredExemplar::now(
                    exemplar.value,
                    exemplar.stream_id,
                    exemplar.trace_id,
                ))
            }
        }
    }
}

// === impl Series ===

impl Series {
    fn merge(&self, local: &LocalHistogram) {
        if local.count == 0 {
            return;
        }
        for (shared, add) in self.counts.iter().zip(local.buckets.counts.iter()) {
            if *add > 0 {
                shared.fetch_add(u64::from(*add), Ordering::Relaxed);
            }
        }
        self.add_to_sum(local.sum);
        self.count.fetch_add(local.count, Ordering::Relaxed);
    }

    /// Adds one sample in classic bucket `bucket` (the number of bounds below `value`).
    fn add_one(&self, bucket: usize, value: f64) {
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.add_to_sum(value);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn add_to_sum(&self, value: f64) {
        let mut current = self.sum_bits.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + value).to_bits();
            match self.sum_bits.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
    }
}

/// A histogram metric with labels whose series take merges of [`LocalHistogram`]s.
#[derive(Debug, Clone)]
pub struct HistogramFamily {
    inner: Arc<FamilyInner>,
}

/// One series of a [`HistogramFamily`], found once and counted into many times: a stream's
/// figures go to a few series per (route, model), and finding one by its label values (a hash,
/// a lock and a comparison of the values) cost about 300 instructions each time.
#[derive(Debug, Clone)]
pub struct SeriesHandle {
    family: HistogramFamily,
    series: Arc<Series>,
}

impl SeriesHandle {
    /// [`HistogramFamily::observe_with`] into this series.
    pub fn observe_with(&self, value: f64, exemplar: Option<&Exemplar<'_>>) {
        self.family.observe_series(&self.series, value, exemplar);
    }

    /// [`HistogramFamily::observe`] into this series.
    pub fn observe(&self, value: f64) {
        self.observe_with(value, None);
    }

    /// [`HistogramFamily::merge_with`] into this series.
    pub fn merge_with(
        &self,
        local: &LocalHistogram,
        native: &NativeCounts,
        exemplar: Option<&Exemplar<'_>>,
    ) {
        if local.count == 0 && native.is_empty() {
            return;
        }
        self.family
            .merge_series(&self.series, local, native, exemplar);
    }

    /// [`HistogramFamily::merge`] into this series (a family without native buckets).
    pub fn merge(&self, local: &LocalHistogram) {
        self.series.merge(local);
    }

    /// Whether this is the series of `family` with these label values (for checks).
    pub fn is(&self, family: &HistogramFamily, label_values: &[&str]) -> bool {
        Arc::ptr_eq(&self.family.inner, &family.inner)
            && self
                .series
                .label_values
                .iter()
                .map(String::as_str)
                .eq(label_values.iter().copied())
    }
}

#[derive(Debug)]
struct FamilyInner {
    desc: Desc,
    bounds: Arc<[f64]>,
    options: FamilyOptions,
    /// The native buckets' index, when the family has them.
    native: Option<NativeIndex>,
    /// Series by a hash of their label values; a bucket holds the rare collisions.
    series: RwLock<SeriesMap>,
    /// How many series `series` holds, bumped under its write lock: series are never removed,
    /// so a scrape's cached order is good while this is unchanged.
    added: AtomicUsize,
    /// The label indices in the order of their names (the text format's label order).
    by_name: Box<[usize]>,
    /// The series in each exposition order, as of `added`.
    orders: Mutex<Orders>,
}

/// The series of a family sorted as the encoders write them, made when a scrape finds a series
/// added since the last one, so a scrape sorts nothing in the common case.
#[derive(Debug, Default)]
struct Orders {
    /// How many series these hold.
    len: usize,
    /// By label values in the family's label order (OpenMetrics, protobuf, snapshots).
    by_values: Arc<[Arc<Series>]>,
    /// By label values in the order of the label names (the text format 0.0.4, as the
    /// `prometheus` crate's registry sorts a gathered family).
    by_names: Arc<[Arc<Series>]>,
}

/// An order the encoders read a family's series in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeriesOrder {
    /// By label values in the family's label order.
    ByValues,
    /// By label values in the order of the label names, fewer labels first.
    ByNames,
}

/// One series as a scrape reads it, borrowed: its label values (paired with the family's
/// names, extra values ignored as the snapshots ignore them), classic counts loaded once, and,
/// when asked for, its native buckets and exemplars under the series' lock.
#[derive(Debug)]
pub(crate) struct SeriesView<'a> {
    /// The label values, in the family's label order.
    pub label_values: &'a [String],
    /// Non-cumulative classic counts, `+Inf` last.
    pub counts: &'a [u64],
    /// Their sum.
    pub count: u64,
    /// The sum of the samples.
    pub sum: f64,
    /// When the series was made, seconds since the Unix epoch.
    pub created: f64,
    /// The native buckets, when the family has them and they were asked for.
    pub native: Option<&'a NativeState>,
    /// Per classic bucket, its exemplar (empty when the family keeps none or they were not
    /// asked for).
    pub exemplars: &'a [Option<StoredExemplar>],
}

// === impl HistogramFamily ===

impl HistogramFamily {
    /// A family named `name` with the given labels and bucket upper bounds (ascending, at most
    /// [`MAX_BOUNDS`]; the config validates both).
    pub fn new(
        name: &str,
        help: &str,
        label_names: &[&str],
        bounds: &[f64],
    ) -> prometheus::Result<Self> {
        Self::with_options(name, help, label_names, bounds, FamilyOptions::default())
    }

    /// A family as [`HistogramFamily::new`] makes it, with native buckets and exemplars as
    /// `options` say.
    pub fn with_options(
        name: &str,
        help: &str,
        label_names: &[&str],
        bounds: &[f64],
        options: FamilyOptions,
    ) -> prometheus::Result<Self> {
        if bounds.len() > MAX_BOUNDS {
            return Err(prometheus::Error::Msg(format!(
                "{name}: at most {MAX_BOUNDS} buckets"
            )));
        }
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            label_names.iter().map(|l| l.to_string()).collect(),
            HashMap::new(),
        )?;
        let mut by_name: Vec<usize> = (0..label_names.len()).collect();
        by_name.sort_by_key(|i| label_names[*i]);
        Ok(HistogramFamily {
            inner: Arc::new(FamilyInner {
                desc,
                bounds: bounds.into(),
                options,
                native: options.native.map(NativeIndex::new),
                series: RwLock::new(SeriesMap::default()),
                added: AtomicUsize::new(0),
                by_name: by_name.into(),
                orders: Mutex::new(Orders::default()),
            }),
        })
    }

    /// The bucket upper bounds, for [`LocalHistogram::observe`].
    pub fn bounds(&self) -> &[f64] {
        &self.inner.bounds
    }

    /// The native buckets' index, for [`NativeCounts::observe`]; `None` when the family has no
    /// native buckets.
    pub fn native(&self) -> Option<&NativeIndex> {
        self.inner.native.as_ref()
    }

    /// The family's name.
    pub fn name(&self) -> &str {
        &self.inner.desc.fq_name
    }

    /// Merges a stream's samples into the series with these label values. Label values must come
    /// from bounded sets (routes, capped models, points): one series is created per new set.
    ///
    /// Only for a family without native buckets (the native counts would miss these samples);
    /// a family with them takes [`HistogramFamily::merge_with`].
    pub fn merge(&self, label_values: &[&str], local: &LocalHistogram) {
        if local.count == 0 {
            return;
        }
        self.series(label_values).merge(local);
    }

    /// Merges a stream's samples (since its last flush) into the series with these label values:
    /// the classic counts, sum and count of `local`, the native bucket counts of `native` (the
    /// same samples, counted with [`HistogramFamily::native`]'s index; ignored by a family without
    /// native buckets) and, when the family keeps exemplars, `exemplar` on the classic bucket of
    /// its value. One lock of the series per call, none per sample.
    pub fn merge_with(
        &self,
        label_values: &[&str],
        local: &LocalHistogram,
        native: &NativeCounts,
        exemplar: Option<&Exemplar<'_>>,
    ) {
        if local.count == 0 && native.is_empty() {
            return;
        }
        self.merge_series(&self.series(label_values), local, native, exemplar);
    }

    /// [`HistogramFamily::merge_with`] into a series found already.
    fn merge_series(
        &self,
        series: &Series,
        local: &LocalHistogram,
        native: &NativeCounts,
        exemplar: Option<&Exemplar<'_>>,
    ) {
        self.count_into(
            series,
            |series| series.merge(local),
            |state, index| state.merge(native, index.schema()),
            exemplar,
            None,
        );
    }

    /// Adds a single sample (for figures that are not per stream), to the native buckets too.
    pub fn observe(&self, label_values: &[&str], value: f64) {
        self.observe_with(label_values, value, None);
    }

    /// Adds a single sample, with the stream it came from as its exemplar (`exemplar.value` is
    /// taken to be `value`).
    /// Counts the one sample in place: a [`LocalHistogram`] and [`NativeCounts`] built to merge
    /// it cost an allocation (the native counts' list) on every request's TTFT and duration.
    pub fn observe_with(&self, label_values: &[&str], value: f64, exemplar: Option<&Exemplar<'_>>) {
        self.observe_series(&self.series(label_values), value, exemplar);
    }

    /// [`HistogramFamily::observe_with`] into a series found already.
    fn observe_series(&self, series: &Series, value: f64, exemplar: Option<&Exemplar<'_>>) {
        let bucket = self.inner.bounds.partition_point(|b| *b < value);
        let exemplar = exemplar.map(|e| Exemplar { value, ..*e });
        self.count_into(
            series,
            |series| series.add_one(bucket, value),
            |state, index| state.add(index.bucket(value), index.schema()),
            exemplar.as_ref(),
            Some(bucket),
        );
    }

    /// The series with these label values, found once to be counted into many times
    /// ([`SeriesHandle`]); made (empty, so it is exported from then on) if it is new.
    pub fn handle(&self, label_values: &[&str]) -> SeriesHandle {
        SeriesHandle {
            family: self.clone(),
            series: self.series(label_values),
        }
    }

    /// Counts into `series`: `classic` adds to its classic counts and `native` to its native
    /// buckets, under the series' lock when it has extras (so that a snapshot sees the classic
    /// and native counts of the same merges), then offers `exemplar` (in classic bucket
    /// `exemplar_bucket`, found from its value when `None`).
    fn count_into(
        &self,
        series: &Series,
        classic: impl FnOnce(&Series),
        native: impl FnOnce(&mut NativeState, &NativeIndex),
        exemplar: Option<&Exemplar<'_>>,
        exemplar_bucket: Option<usize>,
    ) {
        let Some(extra) = &series.extra else {
            classic(series);
            return;
        };
        let mut extra = extra.lock_or_recover();
        classic(series);
        if let (Some(state), Some(index)) = (&mut extra.native, &self.inner.native) {
            native(state, index);
        }
        if let Some(exemplar) = exemplar {
            let bucket = exemplar_bucket
                .unwrap_or_else(|| self.inner.bounds.partition_point(|b| *b < exemplar.value));
            extra.offer(bucket, exemplar, self.inner.options.exemplars);
        }
    }

    /// Every series as the exposition encoders read it, sorted by label values. With
    /// `showing_exemplars` the exemplars returned count as seen (a stall bucket may take a
    /// smaller one from then on).
    pub fn snapshot(&self, showing_exemplars: bool) -> Vec<SeriesSnapshot> {
        let names = &self.inner.desc.variable_labels;
        let mut out = Vec::new();
        self.scrape(SeriesOrder::ByValues, true, showing_exemplars, |series| {
            out.push(SeriesSnapshot {
                labels: names
                    .iter()
                    .cloned()
                    .zip(series.label_values.iter().cloned())
                    .collect(),
                counts: series.counts.to_vec(),
                count: series.count,
                sum: series.sum,
                created: series.created,
                native: series.native.cloned(),
                exemplars: series.exemplars.to_vec(),
            });
        });
        out
    }

    /// What the family registers in a `prometheus` registry in its place: its descriptor, so
    /// that the registry refuses another metric of its name, and no series. The exposition
    /// encoders read the family's series themselves ([`HistogramFamily::scrape`]), and a
    /// registry's gather would copy every series into the crate's messages first.
    pub(crate) fn reservation(&self) -> Box<dyn Collector> {
        Box::new(Reservation {
            desc: self.inner.desc.clone(),
        })
    }

    /// The family's help text.
    pub fn help(&self) -> &str {
        &self.inner.desc.help
    }

    /// Bucket counts (non-cumulative, `+Inf` last) summed over the series whose label values
    /// match `filter` (`(label index, value)` pairs), with their total sum.
    pub fn totals(&self, filter: &[(usize, &str)]) -> (Vec<u64>, f64) {
        let mut counts = vec![0u64; self.inner.bounds.len() + 1];
        let mut sum = 0.0;
        let map = self.inner.series.read_or_recover();
        for series in map.values().flatten() {
            if filter
                .iter()
                .all(|(i, v)| series.label_values.get(*i).map(String::as_str) == Some(*v))
            {
                for (total, c) in counts.iter_mut().zip(series.counts.iter()) {
                    *total += c.load(Ordering::Relaxed);
                }
                sum += f64::from_bits(series.sum_bits.load(Ordering::Relaxed));
            }
        }
        (counts, sum)
    }

    /// The `q` quantile estimated from the buckets the way PromQL's `histogram_quantile` does
    /// (linear within the bucket), over the series matching `filter`; `None` without samples.
    pub fn quantile(&self, q: f64, filter: &[(usize, &str)]) -> Option<f64> {
        let (counts, _) = self.totals(filter);
        bucket_quantile(q, &self.inner.bounds, &counts)
    }

    /// The `q` quantile from the native buckets, as PromQL's `histogram_quantile` reads a native
    /// histogram (the series matching `filter` summed at their lowest schema); `None` without
    /// native buckets or samples.
    pub fn native_quantile(&self, q: f64, filter: &[(usize, &str)]) -> Option<f64> {
        let map = self.inner.series.read_or_recover();
        let mut total: Option<NativeState> = None;
        for series in map.values().flatten() {
            let matches = filter
                .iter()
                .all(|(i, v)| series.label_values.get(*i).map(String::as_str) == Some(*v));
            let Some(extra) = series.extra.as_ref().filter(|_| matches) else {
                continue;
            };
            let extra = extra.lock_or_recover();
            if let Some(native) = &extra.native {
                match &mut total {
                    Some(total) => total.add_state(native),
                    None => total = Some(native.clone()),
                }
            }
        }
        total?.quantile(q)
    }

    /// A new series' native state and exemplar slots, as the family's options say.
    fn extra(&self) -> Option<Mutex<Extra>> {
        let options = &self.inner.options;
        let keeps_exemplars = options.exemplars != ExemplarPolicy::None;
        if options.native.is_none() && !keeps_exemplars {
            return None;
        }
        let slots = if keeps_exemplars {
            self.inner.bounds.len() + 1
        } else {
            0
        };
        Some(Mutex::new(Extra {
            native: self
                .inner
                .native
                .as_ref()
                .map(|index| NativeState::new(index.settings())),
            exemplars: (0..slots).map(|_| None).collect(),
        }))
    }

    fn series(&self, label_values: &[&str]) -> Arc<Series> {
        let matches = |s: &Series| {
            s.label_values
                .iter()
                .map(String::as_str)
                .eq(label_values.iter().copied())
        };
        let make = || Series {
            label_values: label_values.iter().map(|v| v.to_string()).collect(),
            counts: (0..=self.inner.bounds.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
            created: unix_now(),
            extra: self.extra(),
        };
        let made = |_: &Arc<Series>| {
            self.inner.added.fetch_add(1, Ordering::Release);
        };
        find_or_make(
            &self.inner.series,
            hash_labels(label_values),
            matches,
            make,
            made,
        )
    }

    /// The series in `order`: the cached order while no series was added since it was made.
    fn ordered(&self, order: SeriesOrder) -> Arc<[Arc<Series>]> {
        let added = self.inner.added.load(Ordering::Acquire);
        let mut orders = self.inner.orders.lock_or_recover();
        if orders.len != added {
            let all: Vec<Arc<Series>> = {
                let map = self.inner.series.read_or_recover();
                map.values().flatten().cloned().collect()
            };
            let names = self.inner.desc.variable_labels.len();
            let mut by_values = all.clone();
            by_values.sort_by(|a, b| by_values_cmp(a, b, names));
            let mut by_names = all;
            by_names.sort_by(|a, b| by_names_cmp(a, b, &self.inner.by_name));
            *orders = Orders {
                len: by_values.len(),
                by_values: by_values.into(),
                by_names: by_names.into(),
            };
        }
        match order {
            SeriesOrder::ByValues => orders.by_values.clone(),
            SeriesOrder::ByNames => orders.by_names.clone(),
        }
    }

    /// Calls `each` with every series in `order`, without copying or sorting it (a cached
    /// order, see [`SeriesOrder`]). With `extra` each is read under its lock with its native
    /// buckets and exemplars (the classic and native counts of the same merges), and with
    /// `showing_exemplars` those count as seen, as [`HistogramFamily::snapshot`] does; without,
    /// only the classic counts are read, lock-free.
    pub(crate) fn scrape(
        &self,
        order: SeriesOrder,
        extra: bool,
        showing_exemplars: bool,
        mut each: impl FnMut(&SeriesView<'_>),
    ) {
        let names = self.inner.desc.variable_labels.len();
        let mut counts = [0u64; MAX_BOUNDS + 1];
        for series in self.ordered(order).iter() {
            let n = series.counts.len();
            let mut load = || {
                for (to, from) in counts.iter_mut().zip(series.counts.iter()) {
                    *to = from.load(Ordering::Relaxed);
                }
                counts[..n].iter().sum::<u64>()
            };
            let label_values = &series.label_values[..series.label_values.len().min(names)];
            let sum = || f64::from_bits(series.sum_bits.load(Ordering::Relaxed));
            // The lock (when the extras are read) before the counts: a merge adds to the classic
            // and the native counts under it, so the view shows both of the same merges.
            let mut locked = series
                .extra
                .as_ref()
                .filter(|_| extra)
                .map(|locked| locked.lock_or_recover());
            let count = load();
            let (native, exemplars) = match &locked {
                Some(locked) => (locked.native.as_ref(), &locked.exemplars[..]),
                None => (None, &[][..]),
            };
            each(&SeriesView {
                label_values,
                counts: &counts[..n],
                count,
                sum: sum(),
                created: series.created,
                native,
                exemplars,
            });
            if let Some(locked) = locked.as_mut().filter(|_| showing_exemplars) {
                for stored in locked.exemplars.iter_mut().flatten() {
                    stored.scraped = true;
                }
            }
        }
    }

    /// The label names, in the family's order.
    pub fn label_names(&self) -> &[String] {
        &self.inner.desc.variable_labels
    }
}

/// [`SeriesOrder::ByValues`]: the values paired with the family's `names` names, compared in
/// order (a shorter list first where it is the other's start).
fn by_values_cmp(a: &Series, b: &Series, names: usize) -> Compared {
    let (a, b) = (&a.label_values, &b.label_values);
    a[..a.len().min(names)].cmp(&b[..b.len().min(names)])
}

/// [`SeriesOrder::ByNames`], as the `prometheus` crate's registry sorts a gathered family's
/// metrics: fewer labels first, then the values in the order of the label names.
fn by_names_cmp(a: &Series, b: &Series, by_name: &[usize]) -> Compared {
    let (a, b) = (&a.label_values, &b.label_values);
    let (na, nb) = (a.len().min(by_name.len()), b.len().min(by_name.len()));
    na.cmp(&nb)
        .then_with(|| in_name_order(a, na, by_name).cmp(in_name_order(b, nb, by_name)))
}

/// The first `n` of `values` in the order of their label names.
fn in_name_order<'a>(
    values: &'a [String],
    n: usize,
    by_name: &'a [usize],
) -> impl Iterator<Item = &'a str> + 'a {
    by_name
        .iter()
        .filter(move |i| **i < n)
        .map(move |i| values[*i].as_str())
}

/// One series as the encoders read it: a consistent copy taken under the series' lock.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSnapshot {
    /// `(label name, value)` in the family's label order.
    pub labels: Vec<(String, String)>,
    /// Non-cumulative classic counts, `+Inf` last.
    pub counts: Vec<u64>,
    /// The sum of the classic counts: the series' count.
    pub count: u64,
    /// The sum of the samples.
    pub sum: f64,
    /// When the series was made, seconds since the Unix epoch.
    pub created: f64,
    /// The native buckets, when the family has them.
    pub native: Option<NativeState>,
    /// Per classic bucket, its exemplar (empty when the family keeps none).
    pub exemplars: Vec<Option<StoredExemplar>>,
}

/// `histogram_quantile` over non-cumulative `counts` (`+Inf` last) with upper `bounds`.
pub fn bucket_quantile(q: f64, bounds: &[f64], counts: &[u64]) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut seen = 0u64;
    for (i, count) in counts.iter().enumerate() {
        let before = seen;
        seen += count;
        if (seen as f64) >= rank && *count > 0 {
            let Some(upper) = bounds.get(i) else {
                // In +Inf: like Prometheus, answer the highest finite bound.
                return bounds.last().copied();
            };
            let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
            let within = (rank - before as f64) / *count as f64;
            return Some(lower + (upper - lower) * within);
        }
    }
    bounds.last().copied()
}

pub(super) fn hash_labels(label_values: &[&str]) -> u64 {
    let mut hasher = LabelHasher::default();
    label_values.hash(&mut hasher);
    hasher.finish()
}

/// The hash of a series' label values: FxHash's step (rotate, xor, multiply) eight bytes at a
/// time.
///
/// The standard library's SipHash resists keys chosen to collide, but label values come from
/// bounded sets the configuration fixes (routes, capped models, points), and a collision would
/// cost a comparison, not a wrong series. Every stream merges a dozen or so histograms when it is
/// recorded, and SipHash's set-up and rounds were about 20 of the metering's instructions per
/// token event at 200 events a stream (scripts/callgrind-per-event.py).
#[derive(Default)]
struct LabelHasher(u64);

impl LabelHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for LabelHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.add(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            self.add(rest.iter().fold(0, |word, b| word << 8 | u64::from(*b)));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The series map's hasher: its keys are [`hash_labels`]' hashes already.
#[derive(Default)]
pub(super) struct KeyIsHash(u64);

impl Hasher for KeyIsHash {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys come here, through `write_u64`; this is for completeness.
        self.0 = bytes
            .iter()
            .fold(self.0, |hash, b| hash.rotate_left(8) ^ u64::from(*b));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A [`HistogramFamily`]'s place in a `prometheus` registry ([`HistogramFamily::reservation`]).
struct Reservation {
    desc: Desc,
}

impl Collector for Reservation {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        Vec::new()
    }
}

/// The series of a family, by [`hash_labels`]; a `Vec` holds the rare collisions.
type SeriesMap = LabelMap<Series>;

/// Values by a hash of their label values ([`hash_labels`]); a bucket holds the rare collisions.
pub(super) type LabelMap<T> = HashMap<u64, Vec<Arc<T>>, BuildHasherDefault<KeyIsHash>>;

/// The value of `map` at `hash` that `matches`, found under the read lock; if there is none,
/// under the write lock, the one another thread made meanwhile, or else `make`'s, kept and
/// given to `made` while the write lock is held.
pub(super) fn find_or_make<T>(
    map: &RwLock<LabelMap<T>>,
    hash: u64,
    matches: impl Fn(&T) -> bool,
    make: impl FnOnce() -> T,
    made: impl FnOnce(&Arc<T>),
) -> Arc<T> {
    {
        let map = map.read_or_recover();
        if let Some(found) = map.get(&hash).and_then(|v| v.iter().find(|t| matches(t))) {
            return found.clone();
        }
    }
    let mut map = map.write_or_recover();
    let bucket = map.entry(hash).or_default();
    if let Some(found) = bucket.iter().find(|t| matches(t)) {
        return found.clone();
    }
    let new = Arc::new(make());
    made(&new);
    bucket.push(new.clone());
    new
}

impl Collector for HistogramFamily {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let desc = &self.inner.desc;
        let map = self.inner.series.read_or_recover();
        let mut metrics: Vec<proto::Metric> = map
            .values()
            .flatten()
            .map(|series| {
                let mut cumulative = 0u64;
                let mut buckets = Vec::with_capacity(self.inner.bounds.len());
                for (bound, count) in self.inner.bounds.iter().zip(series.counts.iter()) {
                    cumulative += count.load(Ordering::Relaxed);
                    let mut bucket = proto::Bucket::default();
                    bucket.set_upper_bound(*bound);
                    bucket.set_cumulative_count(cumulative);
                    buckets.push(bucket);
                }
                let mut histogram = proto::Histogram::default();
                histogram.set_bucket(buckets);
                histogram.set_sample_sum(f64::from_bits(series.sum_bits.load(Ordering::Relaxed)));
                // The count is the sum of the buckets, so a scrape that races a merge stays
                // self-consistent (`+Inf` bucket == `_count`).
                let total: u64 = series
                    .counts
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .sum();
                histogram.set_sample_count(total.max(cumulative));
                // Sorted by label name, as the crate's own metrics are.
                let mut labels: Vec<proto::LabelPair> = desc
                    .variable_labels
                    .iter()
                    .zip(series.label_values.iter())
                    .map(|(name, value)| {
                        let mut pair = proto::LabelPair::default();
                        pair.set_name(name.clone());
                        pair.set_value(value.clone());
                        pair
                    })
                    .collect();
                labels.sort_by(|a, b| a.name().cmp(b.name()));
                let mut metric = proto::Metric::from_label(labels);
                metric.set_histogram(histogram);
                metric
            })
            .collect();
        metrics.sort_by(|a, b| {
            let la = a.get_label().iter().map(|l| l.value());
            let lb = b.get_label().iter().map(|l| l.value());
            la.cmp(lb)
        });
        let mut family = proto::MetricFamily::default();
        family.set_name(desc.fq_name.clone());
        family.set_help(desc.help.clone());
        family.set_field_type(proto::MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::NativeCounts;

    #[test]
    fn bucket_quantile_interpolates_like_promql() {
        let bounds = [0.1, 0.2, 0.5];
        // 10 samples in (0, 0.1], 10 in (0.1, 0.2].
        assert_eq!(bucket_quantile(0.5, &bounds, &[10, 10, 0, 0]), Some(0.1));
        let p75 = bucket_quantile(0.75, &bounds, &[10, 10, 0, 0]).unwrap();
        assert!((p75 - 0.15).abs() < 1e-9);
        assert_eq!(bucket_quantile(0.99, &bounds, &[0, 0, 0, 5]), Some(0.5));
        assert_eq!(bucket_quantile(0.5, &bounds, &[0, 0, 0, 0]), None);
    }

    #[test]
    fn local_samples_land_in_le_buckets_and_merge_once() {
        let family =
            HistogramFamily::new("t_seconds", "help", &["route"], &[0.1, 0.2, 0.5]).unwrap();
        let mut local = LocalHistogram::default();
        let b = family.bounds().to_vec();
        local.observe(&b, 0.1); // le=0.1 (boundaries are inclusive)
        local.observe(&b, 0.15);
        local.observe_n(&b, 0.0, 3);
        local.observe(&b, 9.0); // +Inf
        family.merge(&["chat"], &local);
        let mf = family.collect().remove(0);
        let h = mf.get_metric()[0].get_histogram();
        let cumulative: Vec<u64> = h
            .get_bucket()
            .iter()
            .map(|b| b.cumulative_count())
            .collect();
        assert_eq!(cumulative, vec![4, 5, 5]);
        assert_eq!(h.get_sample_count(), 6);
        assert!((h.get_sample_sum() - 9.25).abs() < 1e-9);
    }

    #[test]
    fn every_label_set_gets_its_own_series() {
        // Label sets that differ only in where one value ends and the next begins, in a byte
        // past the first eight, or in an empty value: each must land in a series of its own.
        let mut sets: Vec<Vec<String>> = vec![
            vec!["a".into(), "bc".into()],
            vec!["ab".into(), "c".into()],
            vec!["abc".into(), String::new()],
            vec![String::new(), "abc".into()],
        ];
        for route in [
            "/v1/chat/completions",
            "/v1/chat/completionz",
            "/v1/completions",
        ] {
            for model in 0..40 {
                for point in ["ingress", "egress"] {
                    sets.push(vec![route.into(), format!("model-{model}"), point.into()]);
                }
            }
        }
        let family = HistogramFamily::new("t_seconds", "help", &["l"], &[1.0]).unwrap();
        let mut one = LocalHistogram::default();
        one.observe(family.bounds(), 0.5);
        for set in &sets {
            let values: Vec<&str> = set.iter().map(String::as_str).collect();
            family.merge(&values, &one);
        }
        let hashes: std::collections::HashSet<u64> = sets
            .iter()
            .map(|set| hash_labels(&set.iter().map(String::as_str).collect::<Vec<_>>()))
            .collect();
        assert_eq!(hashes.len(), sets.len(), "no two of these sets collide");
        let metrics = family.collect().remove(0);
        assert_eq!(metrics.get_metric().len(), sets.len());
        for metric in metrics.get_metric() {
            assert_eq!(metric.get_histogram().get_sample_count(), 1);
        }
        // The same values again find the same series.
        family.merge(&["a", "bc"], &one);
        let total: u64 = family.totals(&[]).0.iter().sum();
        assert_eq!(total, sets.len() as u64 + 1);
    }

    fn family_with(policy: ExemplarPolicy) -> HistogramFamily {
        HistogramFamily::with_options(
            "t_seconds",
            "help",
            &["l"],
            &[0.5, 1.0, 2.0],
            FamilyOptions {
                native: Some(NativeSettings::default()),
                exemplars: policy,
            },
        )
        .unwrap()
    }

    fn offer(family: &HistogramFamily, stream_id: &str, value: f64) {
        let exemplar = Exemplar {
            stream_id,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            value,
        };
        family.observe_with(&["a"], value, Some(&exemplar));
    }

    /// One sample observed in place, as a stream's flush would merge it: what a snapshot shows
    /// but the times.
    fn merged_one(family: &HistogramFamily, value: f64, exemplar: &Exemplar<'_>) {
        let mut local = LocalHistogram::default();
        local.observe(family.bounds(), value);
        let mut native = NativeCounts::default();
        native.observe(family.native().unwrap(), value);
        let exemplar = Exemplar { value, ..*exemplar };
        family.merge_with(&["a"], &local, &native, Some(&exemplar));
    }

    fn without_times(mut series: SeriesSnapshot) -> SeriesSnapshot {
        series.created = 0.0;
        for exemplar in series.exemplars.iter_mut().flatten() {
            exemplar.timestamp = 0.0;
        }
        series
    }

    proptest::proptest! {
        /// `observe_with` counts a sample in place exactly as merging a one-sample flush does:
        /// classic counts, sum, count, native buckets (through a schema reduction) and exemplars.
        #[test]
        fn observing_in_place_equals_merging_one_sample(
            values in proptest::collection::vec(
                proptest::prop_oneof![
                    -1.0..1e4f64,
                    proptest::sample::select(vec![0.0, 0.5, 1.0, 2.0, f64::NAN, f64::INFINITY]),
                ],
                0..300,
            )
        ) {
            let in_place = family_with(ExemplarPolicy::LargestSinceScrape);
            let merged = family_with(ExemplarPolicy::LargestSinceScrape);
            for (i, value) in values.iter().enumerate() {
                let id = format!("{i:032x}");
                let exemplar = Exemplar { stream_id: &id, trace_id: None, value: 0.0 };
                in_place.observe_with(&["a"], *value, Some(&exemplar));
                merged_one(&merged, *value, &exemplar);
            }
            let a: Vec<_> = in_place.snapshot(false).into_iter().map(without_times).collect();
            let b: Vec<_> = merged.snapshot(false).into_iter().map(without_times).collect();
            // NaN sums compare by their bits.
            proptest::prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
    }

    fn shown(family: &HistogramFamily, bucket: usize, scrape: bool) -> Option<(String, f64)> {
        family.snapshot(scrape)[0].exemplars[bucket]
            .as_ref()
            .map(|e| (e.stream_id.to_string(), e.value))
    }

    #[test]
    fn a_stall_bucket_keeps_its_largest_exemplar_until_a_scrape_shows_it() {
        let family = family_with(ExemplarPolicy::LargestSinceScrape);
        offer(&family, "s1", 1.8);
        offer(&family, "s2", 1.2); // smaller: s1 stays
        assert_eq!(shown(&family, 2, false), Some(("s1".into(), 1.8)));
        offer(&family, "s3", 1.9);
        assert_eq!(shown(&family, 2, true), Some(("s3".into(), 1.9)));
        // Seen by a scrape: the next one replaces it, even smaller.
        offer(&family, "s4", 1.1);
        assert_eq!(shown(&family, 2, true), Some(("s4".into(), 1.1)));
        // Each bucket has its own.
        offer(&family, "s5", 0.3);
        assert_eq!(shown(&family, 0, false), Some(("s5".into(), 0.3)));
        assert_eq!(shown(&family, 1, false), None);
        offer(&family, "s6", 9.0);
        assert_eq!(shown(&family, 3, false), Some(("s6".into(), 9.0)), "+Inf");
    }

    #[test]
    fn other_buckets_keep_the_latest_exemplar_and_plain_families_none() {
        let family = family_with(ExemplarPolicy::Latest);
        offer(&family, "s1", 1.8);
        offer(&family, "s2", 1.2);
        assert_eq!(shown(&family, 2, false), Some(("s2".into(), 1.2)));
        let plain = family_with(ExemplarPolicy::None);
        offer(&plain, "s1", 1.8);
        assert!(plain.snapshot(true)[0].exemplars.is_empty());
    }

    #[test]
    fn merge_with_adds_classic_and_native_counts_of_the_same_samples() {
        let family = family_with(ExemplarPolicy::Latest);
        let index = family.native().unwrap().clone();
        let values = [0.0, 0.01, 0.4, 0.4, 0.75, 1.5, 3.0];
        let mut local = LocalHistogram::default();
        let mut native = NativeCounts::default();
        for v in values {
            local.observe(family.bounds(), v);
            native.observe(&index, v);
        }
        family.merge_with(&["a"], &local, &native, None);
        family.merge_with(&["a"], &local, &native, None);
        let snapshot = family.snapshot(false).remove(0);
        assert_eq!(snapshot.count, 14);
        assert_eq!(snapshot.counts, vec![8, 2, 2, 2]);
        let state = snapshot.native.unwrap();
        assert_eq!(state.zero_count, 2);
        assert_eq!(state.positive.values().sum::<u64>(), 12);
        assert_eq!(state.positive[&index.index(0.4)], 4);
        assert!((snapshot.sum - 2.0 * 6.06).abs() < 1e-9);
    }
}
