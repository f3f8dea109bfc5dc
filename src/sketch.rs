//! A bounded sketch of one stream's gaps, for its p50 and p99 (the jank ratio).
//!
//! Keeping every gap would make a stream's memory grow with its length. Log-spaced buckets with a
//! ratio of 1.04 between neighbours cover 1 µs to about 100 s in a few hundred counters, and any
//! quantile read from them is within 2% of the true gap. Gaps under 1 µs (events of one frame, gap
//! 0) have a bucket of their own. Only the buckets in use take memory (see [`GapSketch`]).

use std::time::Duration;

/// Ratio between neighbouring bucket bounds.
const GAMMA: f64 = 1.04;
/// The smallest gap with a log bucket, in seconds; smaller ones count as zero.
const MIN_GAP: f64 = 1e-6;
/// Log buckets: 1 µs × 1.04^470 ≈ 100 s; longer gaps land in the last bucket.
const BUCKETS: usize = 470;

/// Above this many non-empty buckets the sparse list would take about as much memory as every
/// counter (8 bytes an entry against 4 a bucket): the sketch turns dense.
const SPARSE_MAX: usize = BUCKETS / 2;

/// The lower bound of each log bucket, in seconds: `MIN_GAP · γ^i`.
static LOWER_BOUNDS: [f64; BUCKETS] = LOWER;
const LOWER: [f64; BUCKETS] = lower_bounds();

const fn lower_bounds() -> [f64; BUCKETS] {
    let mut bounds = [MIN_GAP; BUCKETS];
    let mut i = 1;
    while i < BUCKETS {
        bounds[i] = bounds[i - 1] * GAMMA;
        i += 1;
    }
    bounds
}

/// A positive `f64`'s exponent and the top [`KEY_BITS`] bits of its mantissa: a key that grows
/// with the value, each key covering a ratio of at most 33/32 (`1 + (j+1)/32` over `1 + j/32`).
/// That is less than γ, so a key's range holds at most one log bucket bound.
const KEY_BITS: u32 = 5;
const KEY_SHIFT: u32 = f64::MANTISSA_DIGITS - 1 - KEY_BITS;

const fn key(seconds: f64) -> usize {
    (seconds.to_bits() >> KEY_SHIFT) as usize
}

const FIRST_KEY: usize = key(MIN_GAP);
const LAST_KEY: usize = key(LOWER[BUCKETS - 1]);
const KEYS: usize = LAST_KEY - FIRST_KEY + 1;

/// For each key from [`FIRST_KEY`], the log bucket of the key's smallest value (0 below
/// [`MIN_GAP`]): about 850 entries, 1.7 KiB.
static BUCKET_AT_KEY: [u16; KEYS] = bucket_at_key();

const fn bucket_at_key() -> [u16; KEYS] {
    let mut table = [0u16; KEYS];
    let mut k = 0;
    let mut i = 0;
    while k < KEYS {
        let start = f64::from_bits(((FIRST_KEY + k) as u64) << KEY_SHIFT);
        while i + 1 < BUCKETS && LOWER[i + 1] <= start {
            i += 1;
        }
        table[k] = i as u16;
        k += 1;
    }
    table
}

/// The log bucket of a gap of `seconds` (at least [`MIN_GAP`]); the longest gaps share the last.
///
/// The largest `i` with `LOWER_BOUNDS[i] <= seconds`, as a binary search of the bounds would find
/// it, but from the float's bits: the key's table entry is the bucket of the key's smallest value,
/// and one comparison tells whether `seconds` is past the one bound the key's range may hold.
/// A gap is added per token event at two points; the binary search took nine steps and the
/// logarithm three times as many instructions as that.
#[inline]
fn log_bucket(seconds: f64) -> usize {
    let i = usize::from(BUCKET_AT_KEY[key(seconds).clamp(FIRST_KEY, LAST_KEY) - FIRST_KEY]);
    if i + 1 < BUCKETS && LOWER_BOUNDS[i + 1] <= seconds {
        i + 1
    } else {
        i
    }
}

/// Where a gap lands in a [`GapSketch`]: the bucket of gaps under 1 µs (zero gaps, mostly), or a
/// log bucket. Found once per gap and used twice, by the sketch and by a [`GapHistogramIndex`]
/// for the gap's histogram bucket, so that neither searches bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GapBucket(u16);

// === impl GapBucket ===

impl GapBucket {
    /// The bucket of gaps under 1 µs.
    pub const ZERO: GapBucket = GapBucket(0);

    /// The bucket of a gap of `seconds`.
    #[inline]
    pub fn of(seconds: f64) -> GapBucket {
        if seconds >= MIN_GAP {
            GapBucket(log_bucket(seconds) as u16 + 1)
        } else {
            GapBucket::ZERO // NaN too, which no clock gives
        }
    }

    /// The smallest gap in this bucket, in seconds (`-inf` for the zero bucket, whose gaps are
    /// whatever is under 1 µs).
    fn lower_bound(self) -> f64 {
        match self.0 {
            0 => f64::NEG_INFINITY,
            i => LOWER_BOUNDS[usize::from(i) - 1],
        }
    }
}

/// A histogram's bucket for a gap (or any duration: the proxy delay is one), read from the gap's
/// [`GapBucket`] instead of a binary search of the histogram's bounds.
///
/// Each gap bucket starts in a known histogram bucket: the number of bounds below its lower
/// bound. A gap bucket with a histogram bound inside it (at most a few of the 471, for
/// Prometheus bounds a few percent apart or more) takes a step up per bound the gap is past. So
/// the bucket is exactly `bounds.partition_point(|b| *b < seconds)`, for any ascending bounds.
#[derive(Debug)]
pub struct GapHistogramIndex {
    bounds: Box<[f64]>,
    /// Per gap bucket, the number of bounds below its lower bound.
    first: Box<[u8; BUCKETS + 1]>,
}

// === impl GapHistogramIndex ===

impl GapHistogramIndex {
    /// The index of a histogram with these upper bounds (ascending, at most 255 of them).
    pub fn new(bounds: &[f64]) -> Self {
        assert!(bounds.len() <= usize::from(u8::MAX), "too many bounds");
        let mut first = Box::new([0u8; BUCKETS + 1]);
        for (slot, first) in first.iter_mut().enumerate() {
            let lower = GapBucket(slot as u16).lower_bound();
            *first = bounds.partition_point(|b| *b < lower) as u8;
        }
        GapHistogramIndex {
            bounds: bounds.into(),
            first,
        }
    }

    /// The histogram bucket of a gap of `seconds`, whose gap bucket is `gap`
    /// (`GapBucket::of(seconds)`): the number of bounds below `seconds`, the last being `+Inf`.
    #[inline]
    pub fn bucket(&self, gap: GapBucket, seconds: f64) -> usize {
        let mut bucket = usize::from(self.first[usize::from(gap.0)]);
        while self.bounds.get(bucket).is_some_and(|b| *b < seconds) {
            bucket += 1;
        }
        bucket
    }
}

/// The value a quantile reads from log bucket `index`: the bucket holds [MIN·γ^i, MIN·γ^(i+1)),
/// and its midpoint 2γ^(i+1)/(1+γ)·MIN is within (γ-1)/(γ+1) < 2% of any value in it.
fn bucket_value(index: usize) -> Duration {
    let upper = MIN_GAP * GAMMA.powi(index as i32 + 1);
    Duration::from_secs_f64(2.0 * upper / (1.0 + GAMMA))
}

/// Gap counts in log-spaced buckets.
///
/// A stream's gaps fall in a handful of buckets (a steady cadence in two or three, a stall or two
/// in a few more), so the non-empty buckets are kept in a sorted list: 32 bytes plus 8 per bucket
/// in use, where every counter would take 1.9 KiB. A new bucket costs an insertion, and now and
/// then the list grows; a gap that lands in a bucket already used costs a binary search. A sketch
/// with more than [`SPARSE_MAX`] buckets in use switches to a counter for every bucket, so its
/// memory stays bounded (about 1.9 KiB) whatever the stream.
#[derive(Clone, Default)]
pub struct GapSketch {
    zero: u32,
    total: u32,
    buckets: Buckets,
}

/// The counts of the log buckets.
#[derive(Clone)]
enum Buckets {
    /// The non-empty buckets in ascending order, each `index << 32 | count`.
    Sparse(Vec<u64>),
    /// Every bucket's count.
    Dense(Box<[u32; BUCKETS]>),
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets::Sparse(Vec::new())
    }
}

impl std::fmt::Debug for GapSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GapSketch")
            .field("total", &self.total)
            .finish()
    }
}

// === impl Buckets ===

impl Buckets {
    /// Adds `n` (at least 1) to bucket `index`.
    #[inline]
    fn add(&mut self, index: usize, n: u32) {
        match self {
            Buckets::Sparse(entries) => {
                let key = index as u64;
                match entries.binary_search_by_key(&key, |e| e >> 32) {
                    Ok(i) => {
                        let entry = &mut entries[i];
                        let count = (*entry as u32).saturating_add(n);
                        *entry = key << 32 | u64::from(count);
                    }
                    Err(i) if entries.len() < SPARSE_MAX => {
                        entries.insert(i, key << 32 | u64::from(n))
                    }
                    Err(_) => {
                        let mut counts = Box::new([0u32; BUCKETS]);
                        for entry in entries.iter() {
                            counts[(entry >> 32) as usize] = *entry as u32;
                        }
                        counts[index] = n;
                        *self = Buckets::Dense(counts);
                    }
                }
            }
            Buckets::Dense(counts) => {
                let slot = &mut counts[index];
                *slot = slot.saturating_add(n);
            }
        }
    }

    /// Takes `n` from bucket `index` (an emptied sparse entry stays, counting 0).
    fn sub(&mut self, index: usize, n: u32) {
        match self {
            Buckets::Sparse(entries) => {
                let key = index as u64;
                if let Ok(i) = entries.binary_search_by_key(&key, |e| e >> 32) {
                    let entry = &mut entries[i];
                    *entry = key << 32 | u64::from((*entry as u32).saturating_sub(n));
                }
            }
            Buckets::Dense(counts) => counts[index] = counts[index].saturating_sub(n),
        }
    }

    /// Calls `f` with each non-empty bucket's index and count, in ascending order of index,
    /// until it returns a value.
    fn find<T>(&self, mut f: impl FnMut(usize, u32) -> Option<T>) -> Option<T> {
        match self {
            Buckets::Sparse(entries) => entries
                .iter()
                .find_map(|entry| f((entry >> 32) as usize, *entry as u32)),
            Buckets::Dense(counts) => counts
                .iter()
                .enumerate()
                .filter(|(_, count)| **count > 0)
                .find_map(|(index, count)| f(index, *count)),
        }
    }
}

// === impl GapSketch ===

impl GapSketch {
    /// Adds `n` gaps of the same length. The ledgers find the bucket themselves and use
    /// [`GapSketch::add_to`]; this is the tests' shorthand.
    #[cfg(test)]
    pub fn add(&mut self, gap: Duration, n: u32) {
        self.add_to(GapBucket::of(gap.as_secs_f64()), n);
    }

    /// Adds `n` gaps to `bucket`, for a caller that found the bucket already.
    #[inline]
    pub fn add_to(&mut self, bucket: GapBucket, n: u32) {
        match bucket.0 {
            0 => self.zero = self.zero.saturating_add(n),
            _ if n == 0 => {}
            i => self.buckets.add(usize::from(i) - 1, n),
        }
        self.total = self.total.saturating_add(n);
    }

    /// Asks for the line of the sparse buckets, where a steady stream's next gap lands (a dense
    /// sketch's bucket is not known before the gap is).
    #[inline]
    pub fn prefetch(&self) {
        if let Buckets::Sparse(entries) = &self.buckets {
            crate::prefetch::slice(entries);
        }
    }

    /// How many gaps were added.
    pub fn len(&self) -> u32 {
        self.total
    }

    /// True when no gap was added.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The gap at quantile `q` (0..=1) by nearest rank, within 2%; `None` for an empty sketch.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * f64::from(self.total)).ceil() as u64).max(1);
        let mut seen = u64::from(self.zero);
        if seen >= rank {
            return Some(Duration::ZERO);
        }
        self.buckets.find(|index, count| {
            seen += u64::from(count);
            (seen >= rank).then(|| bucket_value(index))
        })
    }

    /// This sketch less the gaps of `part`, which were all added to this one too: the content
    /// phase's gaps from the stream's and the other phases'. Exact, bucket for bucket.
    pub fn subtract(&mut self, part: &GapSketch) {
        self.zero = self.zero.saturating_sub(part.zero);
        self.total = self.total.saturating_sub(part.total);
        part.buckets.find(|index, count| {
            self.buckets.sub(index, count);
            None::<()>
        });
    }

    /// p99 gap / max(p50 gap, 1 ms), for streams with at least `min_gaps` gaps.
    pub fn jank_ratio(&self, min_gaps: u32) -> Option<f64> {
        if self.total < min_gaps {
            return None;
        }
        let p50 = self.quantile(0.50)?.as_secs_f64().max(0.001);
        let p99 = self.quantile(0.99)?.as_secs_f64();
        Some(p99 / p50)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_two_percent() {
        let mut sketch = GapSketch::default();
        let mut exact = Vec::new();
        for i in 1..=1000u64 {
            let gap = Duration::from_micros(i * i * 37 % 2_000_000 + 50);
            sketch.add(gap, 1);
            exact.push(gap);
        }
        exact.sort();
        for q in [0.5, 0.9, 0.99] {
            let rank = (q * 1000.0_f64).ceil() as usize - 1;
            let truth = exact[rank].as_secs_f64();
            let got = sketch.quantile(q).unwrap().as_secs_f64();
            assert!((got - truth).abs() / truth < 0.02, "q{q}: {got} vs {truth}");
        }
    }

    #[test]
    fn every_gap_lands_in_the_bucket_that_holds_it() {
        // The buckets are [MIN·γ^i, MIN·γ^(i+1)), the last open above; the logarithm the lookup
        // replaced gives the same bucket except within rounding of a bound.
        let mut seconds = MIN_GAP;
        let mut agree = 0;
        let mut checked = 0;
        while seconds < 500.0 {
            for value in [seconds, seconds * 1.013, seconds * 1.0399] {
                let i = log_bucket(value);
                assert!(LOWER_BOUNDS[i] <= value, "{value} below bucket {i}");
                if i + 1 < BUCKETS {
                    assert!(value < LOWER_BOUNDS[i + 1], "{value} above bucket {i}");
                }
                let by_log = (((value / MIN_GAP).ln() / GAMMA.ln()) as usize).min(BUCKETS - 1);
                assert!(i.abs_diff(by_log) <= 1, "{value}: {i} vs {by_log}");
                agree += usize::from(i == by_log);
                checked += 1;
            }
            seconds *= 1.0371;
        }
        assert!(
            agree * 10 > checked * 9,
            "{agree} of {checked} as by the logarithm"
        );
        assert_eq!(log_bucket(MIN_GAP), 0);
        assert_eq!(log_bucket(1e6), BUCKETS - 1);
        // A bucket's reading is inside it.
        for i in 0..BUCKETS - 1 {
            let read = bucket_value(i).as_secs_f64();
            assert!(
                LOWER_BOUNDS[i] <= read && read < LOWER_BOUNDS[i + 1],
                "bucket {i}"
            );
        }
    }

    /// The log bucket as the binary search of the bounds found it before the table did.
    fn log_bucket_by_search(seconds: f64) -> usize {
        LOWER_BOUNDS
            .partition_point(|lower| *lower <= seconds)
            .saturating_sub(1)
    }

    #[test]
    fn log_bucket_is_the_binary_search_at_every_bound_and_key_edge() {
        let mut values = vec![MIN_GAP, 1e3, 1e6, 1e300, f64::MAX, f64::INFINITY];
        for lower in LOWER_BOUNDS {
            values.extend([lower.next_down(), lower, lower.next_up()]);
        }
        for key in FIRST_KEY..=LAST_KEY + 2 {
            let start = f64::from_bits((key as u64) << KEY_SHIFT);
            values.extend([start.next_down(), start, start.next_up()]);
        }
        let mut checked = 0;
        for value in values.into_iter().filter(|v| *v >= MIN_GAP) {
            assert_eq!(log_bucket(value), log_bucket_by_search(value), "{value:e}");
            checked += 1;
        }
        assert!(checked > 4 * BUCKETS, "{checked}");
        // The table the doc comments size: 848 keys of two bytes.
        assert_eq!(std::mem::size_of_val(&BUCKET_AT_KEY), 1_696);
    }

    /// Ascending histogram bounds: `steps` ratios of 1.001 to 3 from `start`, so some bounds fall
    /// a fraction of a gap bucket apart and several into one gap bucket.
    fn bounds_strategy() -> impl proptest::strategy::Strategy<Value = Vec<f64>> {
        use proptest::prelude::*;
        (
            1e-8f64..1e-2,
            proptest::collection::vec(1.001f64..3.0, 0..32),
        )
            .prop_map(|(start, steps)| {
                let mut bound = start;
                let mut bounds = Vec::new();
                for step in steps {
                    bounds.push(bound);
                    bound *= step;
                }
                bounds
            })
    }

    proptest::proptest! {
        #[test]
        fn log_bucket_is_the_binary_search_for_any_gap(
            seconds in MIN_GAP..1e9,
        ) {
            proptest::prop_assert_eq!(log_bucket(seconds), log_bucket_by_search(seconds));
        }

        #[test]
        fn histogram_bucket_is_the_binary_search_for_any_bounds_and_gap(
            bounds in bounds_strategy(),
            nanos in proptest::collection::vec(0u64..200_000_000_000, 1..64),
        ) {
            let index = GapHistogramIndex::new(&bounds);
            let mut values: Vec<f64> = nanos.iter().map(|n| *n as f64 * 1e-9).collect();
            // Each bound, and the floats either side of it, too.
            for bound in &bounds {
                values.extend([bound.next_down(), *bound, bound.next_up()]);
            }
            values.extend([0.0, 5e-7, MIN_GAP, f64::INFINITY]);
            for seconds in values {
                let want = bounds.partition_point(|b| *b < seconds);
                proptest::prop_assert_eq!(
                    index.bucket(GapBucket::of(seconds), seconds), want, "{:e}", seconds
                );
            }
        }
    }

    #[test]
    fn gap_buckets_keep_zero_gaps_apart() {
        assert_eq!(GapBucket::of(0.0), GapBucket::ZERO);
        assert_eq!(GapBucket::of(MIN_GAP.next_down()), GapBucket::ZERO);
        assert_eq!(GapBucket::of(f64::NAN), GapBucket::ZERO);
        assert_eq!(GapBucket::of(MIN_GAP), GapBucket(1));
        assert_eq!(GapBucket::of(1e6), GapBucket(BUCKETS as u16));
        let mut by_add = GapSketch::default();
        let mut by_bucket = GapSketch::default();
        for micros in [0, 0, 1, 40, 40, 41, 30_000, 300_000] {
            let gap = Duration::from_micros(micros);
            by_add.add(gap, 2);
            by_bucket.add_to(GapBucket::of(gap.as_secs_f64()), 2);
        }
        by_bucket.add_to(GapBucket::of(0.04), 0);
        assert_eq!(by_add.len(), 16);
        assert_eq!(by_bucket.len(), 16);
        for q in [0.1, 0.2, 0.5, 0.9, 1.0] {
            assert_eq!(by_add.quantile(q), by_bucket.quantile(q), "q{q}");
        }
        assert_eq!(by_add.quantile(0.2), Some(Duration::ZERO));
    }

    #[test]
    fn zero_gaps_and_jank() {
        let mut sketch = GapSketch::default();
        assert_eq!(sketch.jank_ratio(8), None);
        sketch.add(Duration::ZERO, 3);
        sketch.add(Duration::from_millis(30), 96);
        sketch.add(Duration::from_millis(300), 1);
        assert_eq!(sketch.quantile(0.01), Some(Duration::ZERO));
        let jank = sketch.jank_ratio(8).unwrap();
        assert!(
            (0.98..1.02).contains(&jank),
            "p99 is still a 30 ms gap: {jank}"
        );
        sketch.add(Duration::from_millis(300), 2);
        let jank = sketch.jank_ratio(8).unwrap();
        assert!((9.6..10.4).contains(&jank), "{jank}");
    }

    /// The sketch as it was: a counter for every bucket (the same bucket arithmetic, so what is
    /// compared is how the counts are kept). The sparse one must read the same.
    struct DenseReference {
        zero: u32,
        counts: Vec<u32>,
        total: u32,
    }

    impl DenseReference {
        fn add(&mut self, gap: Duration, n: u32) {
            let seconds = gap.as_secs_f64();
            if seconds < MIN_GAP {
                self.zero = self.zero.saturating_add(n);
            } else {
                let slot = &mut self.counts[log_bucket(seconds)];
                *slot = slot.saturating_add(n);
            }
            self.total = self.total.saturating_add(n);
        }

        fn quantile(&self, q: f64) -> Option<Duration> {
            if self.total == 0 {
                return None;
            }
            let rank = ((q.clamp(0.0, 1.0) * f64::from(self.total)).ceil() as u64).max(1);
            let mut seen = u64::from(self.zero);
            if seen >= rank {
                return Some(Duration::ZERO);
            }
            for (index, count) in self.counts.iter().enumerate() {
                seen += u64::from(*count);
                if seen >= rank {
                    return Some(bucket_value(index));
                }
            }
            None
        }
    }

    fn same_quantiles(sketch: &GapSketch, reference: &DenseReference) {
        assert_eq!(sketch.len(), reference.total);
        for i in 0..=200 {
            let q = f64::from(i) / 200.0;
            assert_eq!(sketch.quantile(q), reference.quantile(q), "q{q}");
        }
        assert_eq!(sketch.quantile(2.0), reference.quantile(2.0));
    }

    #[test]
    fn reads_exactly_as_a_counter_per_bucket_sparse_and_dense() {
        let mut sketch = GapSketch::default();
        let mut reference = DenseReference {
            zero: 0,
            counts: vec![0; BUCKETS],
            total: 0,
        };
        let mut x: u64 = 7;
        for step in 0..20_000u32 {
            // A xorshift walk over gaps from 0 to beyond 100 s, zero gaps and counts of 0.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let gap = match x % 4 {
                0 => Duration::ZERO,
                1 => Duration::from_nanos(x % 2_000),
                2 => Duration::from_micros(50_000 + x % 3_000),
                // Log-uniform from 1 µs to beyond the last bucket: every bucket gets used.
                _ => Duration::from_secs_f64(MIN_GAP * GAMMA.powf((x % 480_000) as f64 / 1000.0)),
            };
            let n = (x >> 40) as u32 % 4;
            sketch.add(gap, n);
            reference.add(gap, n);
            if step % 97 == 0 {
                same_quantiles(&sketch, &reference);
            }
            if step == 40 {
                assert!(matches!(sketch.buckets, Buckets::Sparse(_)));
            }
        }
        assert!(
            matches!(sketch.buckets, Buckets::Dense(_)),
            "every bucket was used"
        );
        same_quantiles(&sketch, &reference);
        assert_eq!(sketch.jank_ratio(8), {
            let p50 = reference.quantile(0.5).unwrap().as_secs_f64().max(0.001);
            Some(reference.quantile(0.99).unwrap().as_secs_f64() / p50)
        });
    }

    #[test]
    fn counts_saturate_as_before() {
        let mut sketch = GapSketch::default();
        let gap = Duration::from_millis(50);
        sketch.add(gap, u32::MAX - 1);
        sketch.add(gap, 5);
        sketch.add(Duration::from_millis(500), 1);
        assert_eq!(sketch.len(), u32::MAX);
        let Buckets::Sparse(entries) = &sketch.buckets else {
            panic!("two buckets are sparse");
        };
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0] as u32, u32::MAX);
    }

    #[test]
    fn memory_is_small_and_bounded() {
        assert!(std::mem::size_of::<GapSketch>() <= 40);
        let mut steady = GapSketch::default();
        for i in 0..10_000u64 {
            steady.add(Duration::from_micros(49_000 + i % 2_000), 1);
        }
        let Buckets::Sparse(entries) = &steady.buckets else {
            panic!("a steady cadence uses a few buckets");
        };
        assert!(entries.len() <= 3, "{}", entries.len());
        // Beyond half the buckets the list gives way to the counters (1.9 KiB).
        let mut every = GapSketch::default();
        for i in 0..BUCKETS as i32 {
            every.add(Duration::from_secs_f64(MIN_GAP * GAMMA.powi(i) * 1.01), 1);
        }
        assert!(matches!(every.buckets, Buckets::Dense(_)));
    }
}
