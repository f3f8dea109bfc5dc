//! Prometheus native histograms: sparse exponential buckets kept beside the classic ones.
//!
//! At schema `s` the bucket with index `i` holds the values in (2^((i-1)/2^s), 2^(i/2^s)], so
//! neighbouring bounds are 2^(2^-s) apart (schema 4: 2^(1/16), about 4.4 %, a quantile within
//! about 2.2 %); values at most the zero threshold are counted in the zero bucket. A stream counts
//! its samples in a [`NativeCounts`] (indices already found, no atomics), and the shared series
//! takes them at a flush in a [`NativeState`]. When a series has more than `max_buckets` buckets
//! it halves its resolution (the schema drops by one and pairs of buckets merge), as Prometheus's
//! own client (client_golang) does.

use std::collections::BTreeMap;

use super::native_bounds::NATIVE_BOUNDS;

/// The coarsest schema Prometheus knows: bounds 2^16 apart.
pub const MIN_SCHEMA: i8 = -4;
/// The finest schema Prometheus knows: bounds 2^(1/256) apart.
pub const MAX_SCHEMA: i8 = 8;

/// The native-histogram settings of a family (`[metrics.native]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NativeSettings {
    /// The schema new series start at, [`MIN_SCHEMA`] to [`MAX_SCHEMA`].
    pub schema: i8,
    /// Samples at most this are counted in the zero bucket.
    pub zero_threshold: f64,
    /// Past this many buckets a series halves its resolution.
    pub max_buckets: usize,
}

impl Default for NativeSettings {
    fn default() -> Self {
        NativeSettings {
            schema: 4,
            zero_threshold: DEFAULT_ZERO_THRESHOLD,
            max_buckets: 160,
        }
    }
}

/// Prometheus's default zero threshold, 2^-128: a bucket bound at every schema.
pub const DEFAULT_ZERO_THRESHOLD: f64 = 2.938_735_877_055_719e-39;

/// The native bucket of a value, by the rule above, for one schema: what a stream calls per
/// sample, in a handful of instructions and without a search.
///
/// For schemas above 0 the value's mantissa is compared with the bounds of its octave. The top
/// `s + 1` bits of the mantissa split an octave into 2^(s+1) equal parts, each narrower than a
/// bucket (a ratio of at most 1 + 2^-(s+1), against 2^(2^-s) > 1 + 0.69 · 2^-s), so a part holds
/// at most one bound: a table gives the bucket of the part's start, and one comparison of
/// mantissa bits says whether the value is past that bound.
#[derive(Debug, Clone)]
pub struct NativeIndex {
    settings: NativeSettings,
    /// Per part of an octave: the bucket (0..2^s) of its first value.
    first: Box<[u16]>,
    /// The mantissa bits of each bound (`NATIVE_BOUNDS` at this schema), with 2^52 (a mantissa of
    /// 1.0) last so that a part past the octave's last bound compares without a special case.
    bound_bits: Box<[u64]>,
}

const MANTISSA_BITS: u32 = 52;
const MANTISSA_MASK: u64 = (1 << MANTISSA_BITS) - 1;

// === impl NativeIndex ===

impl NativeIndex {
    /// The index for `settings` (schema within [`MIN_SCHEMA`]..=[`MAX_SCHEMA`]: clamped).
    pub fn new(settings: NativeSettings) -> Self {
        let schema = settings.schema.clamp(MIN_SCHEMA, MAX_SCHEMA);
        let settings = NativeSettings { schema, ..settings };
        if schema <= 0 {
            return NativeIndex {
                settings,
                first: Box::new([]),
                bound_bits: Box::new([]),
            };
        }
        let n = 1usize << schema;
        let stride = 256 / n;
        let mut bound_bits: Vec<u64> = (0..n)
            .map(|j| NATIVE_BOUNDS[j * stride].to_bits() & MANTISSA_MASK)
            .collect();
        bound_bits.push(1 << MANTISSA_BITS);
        let part_bits = schema as u32 + 1;
        let first = (0..1u64 << part_bits)
            .map(|part| {
                // The part's first mantissa; its bucket is the first bound not below it.
                let start = part << (MANTISSA_BITS - part_bits);
                bound_bits.partition_point(|b| *b < start) as u16
            })
            .collect();
        NativeIndex {
            settings,
            first,
            bound_bits: bound_bits.into(),
        }
    }

    /// The settings, schema clamped.
    pub fn settings(&self) -> NativeSettings {
        self.settings
    }

    /// The schema buckets are found at.
    pub fn schema(&self) -> i8 {
        self.settings.schema
    }

    /// The zero bucket's threshold.
    pub fn zero_threshold(&self) -> f64 {
        self.settings.zero_threshold
    }

    /// The bucket of `value`, or `None` for the zero bucket (at most the zero threshold, and
    /// NaN). Infinity shares the bucket of `f64::MAX`.
    #[inline]
    pub fn bucket(&self, value: f64) -> Option<i32> {
        if value.is_nan() || value <= self.settings.zero_threshold {
            return None;
        }
        Some(self.index(value.min(f64::MAX)))
    }

    /// The bucket of a positive finite `value`, zero threshold aside.
    #[inline]
    pub fn index(&self, value: f64) -> i32 {
        let (mantissa, exp) = frexp_bits(value);
        let schema = self.settings.schema;
        if schema <= 0 {
            // The octave's upper bound is 2^exp; an exact power of two (mantissa 0.5) belongs
            // to the octave below. Then 2^-schema octaves per bucket, rounding up.
            let key = exp - i32::from(mantissa == 0);
            let shift = -i32::from(schema);
            return (key + (1 << shift) - 1) >> shift;
        }
        let part_bits = schema as u32 + 1;
        let part = (mantissa >> (MANTISSA_BITS - part_bits)) as usize;
        let mut j = usize::from(self.first[part]);
        if mantissa > self.bound_bits[j] {
            j += 1;
        }
        j as i32 + (exp - 1) * (1 << schema)
    }
}

/// A positive finite f64 as `frac · 2^exp` with `frac` in [0.5, 1) (C's `frexp`): `frac`'s
/// mantissa bits (its value is 0.5 · (1 + bits / 2^52)) and `exp`.
#[inline]
fn frexp_bits(value: f64) -> (u64, i32) {
    let bits = value.to_bits();
    let biased = ((bits >> MANTISSA_BITS) & 0x7ff) as i32;
    if bits & !(1 << 63) == 0 {
        // Zero, which callers keep for the zero bucket: the lowest octave of all.
        return (0, -1073);
    }
    if biased == 0 {
        // Subnormal: scale into the normal range first.
        let (mantissa, exp) = frexp_bits(value * f64::from_bits(0x43f0_0000_0000_0000)); // 2^64
        return (mantissa, exp - 64);
    }
    (bits & MANTISSA_MASK, biased - 1022)
}

/// The upper bound of native bucket `index` at `schema`: 2^(index / 2^schema).
pub fn bucket_upper_bound(index: i32, schema: i8) -> f64 {
    if schema <= 0 {
        return pow2(index.saturating_mul(1 << (-schema)));
    }
    let n = 1i32 << schema;
    let (octave, j) = (index.div_euclid(n), index.rem_euclid(n));
    // 2^octave · 2^(j/n) = 2^(octave+1) · NATIVE_BOUNDS[j at schema 8]
    let stride = 256 / n;
    NATIVE_BOUNDS[(j * stride) as usize] * pow2(octave + 1)
}

/// 2^e exactly where it is an f64 (0 below the subnormals, infinity above the largest).
fn pow2(e: i32) -> f64 {
    match e {
        ..=-1075 => 0.0,
        -1074..=-1023 => f64::from_bits(1 << (e + 1074)),
        -1022..=1023 => f64::from_bits(((e + 1023) as u64) << MANTISSA_BITS),
        _ => f64::INFINITY,
    }
}

/// A stream's native bucket counts since its last flush (indices at the family's schema); the
/// sum and count are the classic [`super::LocalHistogram`]'s beside it.
///
/// The non-empty buckets are a sorted list of `index << 32 | count` (a stream's samples fall in
/// a handful of buckets): a sample costs a binary search of a few entries, and a new bucket an
/// insertion (the list grows now and then, as a stream's gap sketch does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeCounts {
    zero: u64,
    buckets: Vec<u64>,
}

// === impl NativeCounts ===

impl NativeCounts {
    /// Counts one sample of `value` in its bucket by `index` (the family's).
    #[inline]
    pub fn observe(&mut self, index: &NativeIndex, value: f64) {
        self.add(index.bucket(value), 1);
    }

    /// Counts `n` samples in bucket `bucket` (`None`: the zero bucket), for a caller that found
    /// it already with [`NativeIndex::bucket`].
    #[inline]
    pub fn add(&mut self, bucket: Option<i32>, n: u32) {
        if n == 0 {
            return;
        }
        let Some(index) = bucket else {
            self.zero += u64::from(n);
            return;
        };
        // Biased so that the keys sort as the indices do.
        let key = u64::from((index as u32) ^ 0x8000_0000);
        match self.buckets.binary_search_by_key(&key, |e| e >> 32) {
            Ok(i) => {
                let entry = &mut self.buckets[i];
                let count = (*entry as u32).saturating_add(n);
                *entry = key << 32 | u64::from(count);
            }
            Err(i) => self.buckets.insert(i, key << 32 | u64::from(n)),
        }
    }

    /// The samples counted, zero bucket included.
    pub fn count(&self) -> u64 {
        self.zero
            + self
                .buckets
                .iter()
                .map(|e| u64::from(*e as u32))
                .sum::<u64>()
    }

    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.zero == 0 && self.buckets.is_empty()
    }

    /// Forgets every count, keeping the list's memory (a flush).
    pub fn clear(&mut self) {
        self.zero = 0;
        self.buckets.clear();
    }

    /// The zero bucket's count.
    pub fn zero_count(&self) -> u64 {
        self.zero
    }

    /// The non-empty buckets, `(index, count)` in ascending order of index.
    pub fn buckets(&self) -> impl Iterator<Item = (i32, u64)> + '_ {
        self.buckets.iter().map(|e| {
            (
                ((e >> 32) as u32 ^ 0x8000_0000) as i32,
                u64::from(*e as u32),
            )
        })
    }
}

/// A shared series' native buckets: what the flushes of its streams added, at its current
/// schema.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeState {
    /// The schema; starts at the settings' and drops by one each time the buckets overflow.
    pub schema: i8,
    /// The zero bucket's threshold.
    pub zero_threshold: f64,
    /// The zero bucket's count.
    pub zero_count: u64,
    /// Non-empty positive buckets by index.
    pub positive: BTreeMap<i32, u64>,
    max_buckets: usize,
}

// === impl NativeState ===

impl NativeState {
    /// An empty series with `settings`.
    pub fn new(settings: NativeSettings) -> Self {
        NativeState {
            schema: settings.schema.clamp(MIN_SCHEMA, MAX_SCHEMA),
            zero_threshold: settings.zero_threshold,
            zero_count: 0,
            positive: BTreeMap::new(),
            max_buckets: settings.max_buckets.max(1),
        }
    }

    /// Adds a stream's counts, found at `schema` (the family's, at least this series').
    pub fn merge(&mut self, counts: &NativeCounts, schema: i8) {
        self.zero_count += counts.zero;
        let shift = i32::from(schema - self.schema).max(0);
        for (index, n) in counts.buckets() {
            *self.positive.entry(downscale(index, shift)).or_insert(0) += n;
        }
        self.limit();
    }

    /// Adds one sample found at `schema` (`None`: the zero bucket).
    pub fn add(&mut self, bucket: Option<i32>, schema: i8) {
        match bucket {
            None => self.zero_count += 1,
            Some(index) => {
                let shift = i32::from(schema - self.schema).max(0);
                *self.positive.entry(downscale(index, shift)).or_insert(0) += 1;
                self.limit();
            }
        }
    }

    /// Halves the resolution until at most `max_buckets` buckets are in use (or the schema is
    /// [`MIN_SCHEMA`]).
    fn limit(&mut self) {
        while self.positive.len() > self.max_buckets && self.schema > MIN_SCHEMA {
            let before = std::mem::take(&mut self.positive);
            for (index, n) in before {
                *self.positive.entry(downscale(index, 1)).or_insert(0) += n;
            }
            self.schema -= 1;
        }
    }

    /// Adds another series' buckets, at the lower of the two schemas (as PromQL sums native
    /// histograms of different schemas).
    pub fn add_state(&mut self, other: &NativeState) {
        if other.schema < self.schema {
            let shift = i32::from(self.schema - other.schema);
            let before = std::mem::take(&mut self.positive);
            for (index, n) in before {
                *self.positive.entry(downscale(index, shift)).or_insert(0) += n;
            }
            self.schema = other.schema;
        }
        let shift = i32::from(other.schema - self.schema);
        for (index, n) in &other.positive {
            *self.positive.entry(downscale(*index, shift)).or_insert(0) += n;
        }
        self.zero_count += other.zero_count;
        self.zero_threshold = self.zero_threshold.max(other.zero_threshold);
    }

    /// The samples counted: the zero bucket's and every positive bucket's.
    pub fn count(&self) -> u64 {
        self.zero_count + self.positive.values().sum::<u64>()
    }

    /// The `q` quantile as PromQL's `histogram_quantile` reads a native histogram: the bucket
    /// where the rank `q * count` falls, interpolated exponentially inside it (linearly inside
    /// the zero bucket, from 0 to its threshold). `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 || q.is_nan() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        if rank <= self.zero_count as f64 {
            let fraction = if self.zero_count == 0 {
                0.0
            } else {
                rank / self.zero_count as f64
            };
            return Some(self.zero_threshold * fraction);
        }
        let mut below = self.zero_count as f64;
        let mut last = None;
        for (index, n) in &self.positive {
            let n = *n as f64;
            last = Some(*index);
            if below + n >= rank {
                let upper = bucket_upper_bound(*index, self.schema);
                let lower = bucket_upper_bound(index - 1, self.schema);
                let fraction = (rank - below) / n;
                let (log_lower, log_upper) = (lower.log2(), upper.log2());
                return Some((log_lower + (log_upper - log_lower) * fraction).exp2());
            }
            below += n;
        }
        last.map(|index| bucket_upper_bound(index, self.schema))
    }

    /// The buckets as Prometheus's protobuf carries them: spans of consecutive indices
    /// (`offset` from the end of the previous span, or the first index) and each bucket's count
    /// as the difference from the previous bucket's.
    pub fn spans_and_deltas(&self) -> (Vec<(i32, u32)>, Vec<i64>) {
        let mut spans: Vec<(i32, u32)> = Vec::new();
        let mut deltas = Vec::with_capacity(self.positive.len());
        let mut next: Option<i32> = None;
        let mut previous = 0i64;
        for (index, count) in &self.positive {
            match next {
                Some(expected) if expected == *index => {
                    if let Some(last) = spans.last_mut() {
                        last.1 += 1;
                    }
                }
                Some(expected) => spans.push((index - expected, 1)),
                None => spans.push((*index, 1)),
            }
            next = Some(index + 1);
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            deltas.push(count - previous);
            previous = count;
        }
        (spans, deltas)
    }
}

/// The index at a schema `shift` lower: 2^shift buckets become one, rounding the index up.
fn downscale(index: i32, shift: i32) -> i32 {
    if shift == 0 {
        return index;
    }
    (index + (1 << shift) - 1) >> shift
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every value counted into a series at `settings`' schema.
    fn state_of(values: &[f64], settings: NativeSettings) -> NativeState {
        let index = NativeIndex::new(settings);
        let mut counts = NativeCounts::default();
        for v in values {
            counts.observe(&index, *v);
        }
        let mut state = NativeState::new(settings);
        state.merge(&counts, index.schema());
        state
    }

    fn exact(sorted: &[f64], q: f64) -> f64 {
        let rank = (q * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    #[test]
    fn quantiles_at_schema_4_are_within_about_2_percent_of_the_exact_ones() {
        // 20,000 gaps spread over 1 ms to 1 s, log-uniform, and a cadence of 40 ms with jitter.
        let mut x: u64 = 3;
        let mut values = Vec::new();
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            values.push(if i % 2 == 0 {
                1e-3 * 1000f64.powf(u)
            } else {
                0.040 * (0.8 + 0.4 * u)
            });
        }
        let state = state_of(&values, NativeSettings::default());
        values.sort_by(f64::total_cmp);
        for q in [0.5, 0.9, 0.99, 0.999] {
            let (got, want) = (state.quantile(q).unwrap(), exact(&values, q));
            assert!(
                (got / want - 1.0).abs() < 0.022,
                "q {q}: native {got} against exact {want}"
            );
        }
        assert_eq!(state.count(), 20_000);
        assert_eq!(
            NativeState::new(NativeSettings::default()).quantile(0.5),
            None
        );
    }

    #[test]
    fn series_of_different_schemas_add_at_the_lower_one() {
        let values = [0.003, 0.004, 0.010, 0.250, 0.251];
        let fine = state_of(&values, NativeSettings::default());
        let coarse = state_of(
            &values,
            NativeSettings {
                schema: 1,
                ..NativeSettings::default()
            },
        );
        let mut sum = fine.clone();
        sum.add_state(&coarse);
        assert_eq!(sum.schema, 1);
        assert_eq!(sum.count(), 10);
        let mut twice = coarse.clone();
        twice.add_state(&coarse);
        assert_eq!(sum.positive, twice.positive);
    }

    /// An unsigned big integer, least significant limb first: enough to raise a mantissa to the
    /// 256th power exactly.
    fn square(x: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64; x.len() * 2];
        for (i, a) in x.iter().enumerate() {
            let mut carry = 0u128;
            for (j, b) in x.iter().enumerate() {
                let t = u128::from(out[i + j]) + u128::from(*a) * u128::from(*b) + carry;
                out[i + j] = t as u64;
                carry = t >> 64;
            }
            let mut k = i + x.len();
            while carry > 0 {
                let t = u128::from(out[k]) + carry;
                out[k] = t as u64;
                carry = t >> 64;
                k += 1;
            }
        }
        while out.len() > 1 && out.last() == Some(&0) {
            out.pop();
        }
        out
    }

    fn bit_length(x: &[u64]) -> i64 {
        let top = x.len() - 1;
        64 * top as i64 + (64 - i64::from(x[top].leading_zeros()))
    }

    fn is_power_of_two(x: &[u64]) -> bool {
        x.iter().map(|l| l.count_ones()).sum::<u32>() == 1
    }

    /// The rule itself, in exact integer arithmetic: the smallest `i` with
    /// `value <= 2^(i / 2^schema)`, that is `ceil(2^schema · log2(value))`.
    fn exact_index(value: f64, schema: i8) -> i32 {
        // value = m · 2^e exactly, m an integer.
        let bits = value.to_bits();
        let biased = ((bits >> 52) & 0x7ff) as i64;
        let (m, e) = if biased == 0 {
            (bits & MANTISSA_MASK, -1074)
        } else {
            ((bits & MANTISSA_MASK) | 1 << 52, biased - 1075)
        };
        let ceil_log2 = |p: &[u64], scale: i64| {
            // ceil(log2(p · 2^scale))
            let l = bit_length(p) - 1 + scale;
            if is_power_of_two(p) {
                l
            } else {
                l + 1
            }
        };
        if schema <= 0 {
            let c = ceil_log2(&[m], e);
            let d = 1i64 << (-schema);
            return (c.div_euclid(d) + i64::from(c.rem_euclid(d) != 0)) as i32;
        }
        // ceil(n · log2(m · 2^e)) = ceil(log2(m^n) + n·e)
        let mut p = vec![m];
        for _ in 0..schema {
            p = square(&p);
        }
        (ceil_log2(&p, e * (1 << schema))) as i32
    }

    #[test]
    fn the_bounds_table_is_rounded_down() {
        // NATIVE_BOUNDS[j] <= 2^(j/256 - 1) < next_up(NATIVE_BOUNDS[j]): with b = m·2^e,
        // b^256 <= 2^(j-256) exactly when 256·log2(b) <= j - 256.
        for (j, bound) in NATIVE_BOUNDS.iter().enumerate() {
            let target = j as i32 - 256;
            assert!(exact_index(*bound, 8) <= target, "{j}: {bound} too high");
            if j > 0 {
                assert!(
                    exact_index(bound.next_up(), 8) > target,
                    "{j}: {bound} too low"
                );
            }
        }
    }

    fn check(value: f64) {
        for schema in MIN_SCHEMA..=MAX_SCHEMA {
            let index = NativeIndex::new(NativeSettings {
                schema,
                zero_threshold: 0.0,
                max_buckets: 160,
            });
            assert_eq!(
                index.index(value),
                exact_index(value, schema),
                "{value:e} at schema {schema}"
            );
        }
    }

    #[test]
    fn powers_of_two_and_their_neighbours() {
        for e in -1074..=1023 {
            let p = pow2(e);
            check(p);
            check(p.next_up());
            if p.next_down() > 0.0 {
                check(p.next_down());
            }
        }
        // Every bound of schema 8 in a few octaves, and the floats beside it.
        for e in [-30, -1, 0, 1, 10] {
            for b in NATIVE_BOUNDS {
                let v = b * pow2(e);
                check(v);
                check(v.next_up());
                check(v.next_down());
            }
        }
        check(f64::MAX);
        check(f64::MIN_POSITIVE);
    }

    proptest! {
        #[test]
        fn any_positive_value(bits in 1u64..0x7ff0_0000_0000_0000) {
            check(f64::from_bits(bits));
        }

        #[test]
        fn any_latency(seconds in 1e-9f64..1e5) {
            check(seconds);
        }

        /// Merging streams' counts equals adding every sample to one series, at any schema and
        /// bucket limit.
        #[test]
        fn merging_streams_equals_observing_every_value(
            streams in proptest::collection::vec(
                proptest::collection::vec(0f64..100.0, 0..60), 1..8),
            schema in MIN_SCHEMA..=MAX_SCHEMA,
            max_buckets in 1usize..200,
        ) {
            let settings = NativeSettings { schema, zero_threshold: 1e-3, max_buckets };
            let index = NativeIndex::new(settings);
            let mut merged = NativeState::new(settings);
            let mut each = NativeState::new(settings);
            for stream in &streams {
                let mut counts = NativeCounts::default();
                for v in stream {
                    counts.observe(&index, *v);
                    each.add(index.bucket(*v), schema);
                }
                prop_assert_eq!(counts.count(), stream.len() as u64);
                merged.merge(&counts, schema);
            }
            // The order of halvings may differ; bring both to the coarser schema.
            let target = merged.schema.min(each.schema);
            for state in [&mut merged, &mut each] {
                let shift = i32::from(state.schema - target);
                let before = std::mem::take(&mut state.positive);
                for (i, n) in before {
                    *state.positive.entry(downscale(i, shift)).or_insert(0) += n;
                }
                state.schema = target;
            }
            prop_assert_eq!(&merged, &each);
        }
    }

    #[test]
    fn a_series_halves_its_resolution_past_max_buckets() {
        let settings = NativeSettings {
            schema: 4,
            zero_threshold: 0.0,
            max_buckets: 10,
        };
        let index = NativeIndex::new(settings);
        let mut state = NativeState::new(settings);
        let mut counts = NativeCounts::default();
        for i in 0..100 {
            counts.observe(&index, 1.0 + f64::from(i) * 0.05);
        }
        state.merge(&counts, 4);
        assert!(state.positive.len() <= 10, "{}", state.positive.len());
        assert!(state.schema < 4);
        assert_eq!(state.positive.values().sum::<u64>(), 100);
        // Each value is in its bucket at the final schema.
        let coarse = NativeIndex::new(NativeSettings {
            schema: state.schema,
            ..settings
        });
        let mut again = BTreeMap::new();
        for i in 0..100 {
            *again
                .entry(coarse.index(1.0 + f64::from(i) * 0.05))
                .or_insert(0u64) += 1;
        }
        assert_eq!(state.positive, again);
    }

    #[test]
    fn spans_and_deltas_as_the_protobuf_wants() {
        let mut state = NativeState::new(NativeSettings::default());
        for (i, n) in [(-3, 2u64), (-2, 5), (0, 1), (4, 4), (5, 4)] {
            state.positive.insert(i, n);
        }
        let (spans, deltas) = state.spans_and_deltas();
        assert_eq!(spans, vec![(-3, 2), (1, 1), (3, 2)]);
        assert_eq!(deltas, vec![2, 3, -4, 3, 0]);
    }

    #[test]
    fn upper_bounds_hold_their_bucket() {
        for schema in MIN_SCHEMA..=MAX_SCHEMA {
            let index = NativeIndex::new(NativeSettings {
                schema,
                zero_threshold: 0.0,
                max_buckets: 160,
            });
            for i in [-300, -17, -1, 0, 1, 5, 64, 200] {
                let upper = bucket_upper_bound(i, schema);
                if !(upper > 0.0 && upper < f64::MAX) {
                    continue;
                }
                assert_eq!(index.index(upper), i, "schema {schema} bucket {i}");
                assert_eq!(index.index(upper.next_up()), i + 1);
            }
        }
    }

    #[test]
    fn zero_bucket() {
        let index = NativeIndex::new(NativeSettings::default());
        assert_eq!(index.bucket(0.0), None);
        assert_eq!(index.bucket(DEFAULT_ZERO_THRESHOLD), None);
        assert_eq!(index.bucket(f64::NAN), None);
        assert_eq!(index.bucket(1.0), Some(0));
        assert_eq!(index.bucket(f64::INFINITY), Some(index.index(f64::MAX)));
        let mut counts = NativeCounts::default();
        counts.add(None, 3);
        counts.add(Some(-5), 2);
        counts.add(Some(7), 1);
        counts.add(Some(-5), 1);
        assert_eq!(counts.buckets().collect::<Vec<_>>(), vec![(-5, 3), (7, 1)]);
        assert_eq!(counts.count(), 7);
    }
}
