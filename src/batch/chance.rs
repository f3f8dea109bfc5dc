//! Would this co-stall happen by chance? The rule that opens an episode beyond the floors
//! (`min_streams`, `min_share`; docs/batch.md, "Episodes that would not happen by chance").
//!
//! Each stream's recent share of time inside a hitch of its own (`scope="stream"` hitches,
//! decayed over `batch.rate_window`) is its chance `p_i` of being inside one at a given moment,
//! shrunk toward its upstream's pooled share (itself shrunk toward [`PRIOR_SHARE`]) so a young
//! stream is not judged on a few seconds. If streams stalled independently, the number inside a
//! hitch at once would be a Poisson-binomial count with mean `λ = Σ p_i`. An episode needs
//! `k ≥ λ + 1` streams inside at once and `P(Bin(n, λ/n) ≥ k) ≤ batch.false_positive`: by
//! Hoeffding (1956), for `k ≥ λ + 1` the binomial tail with the same mean bounds the
//! Poisson-binomial tail from above, so the rule's false-positive chance per moment judged is at
//! most `false_positive` whatever the streams' own rates are.

/// The share of time a stream is assumed inside a hitch of its own before anything is seen.
pub const PRIOR_SHARE: f64 = 0.02;

/// How many stream-seconds the prior weighs, for the upstream's pool and for each stream.
pub const PRIOR_SECONDS: f64 = 4.0;

/// An exponentially decayed sum of seconds, decayed with time constant `tau` (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Decayed {
    value: f64,
    /// When `value` was last brought up to date (nanoseconds).
    at: i64,
}

// === impl Decayed ===

impl Decayed {
    /// The sum at `now`.
    pub fn at(&self, now: i64, tau: f64) -> f64 {
        self.value * decay(now - self.at, tau)
    }

    /// Adds `seconds` at `now`.
    pub fn add(&mut self, now: i64, seconds: f64, tau: f64) {
        self.value = self.at(now, tau) + seconds;
        self.at = now;
    }
}

/// `exp(-elapsed / tau)`, elapsed in nanoseconds, tau in seconds (1 for no time or the past).
fn decay(elapsed: i64, tau: f64) -> f64 {
    if elapsed <= 0 {
        return 1.0;
    }
    (-(elapsed as f64 * 1e-9) / tau).exp()
}

/// The decayed time a stream started at `start` has been observed by `now`: the integral of the
/// decay over its life.
pub fn observed(start: i64, now: i64, tau: f64) -> f64 {
    tau * (1.0 - decay(now - start, tau))
}

/// A stream's chance of being inside a hitch of its own at a given moment: `hitched` seconds
/// inside one over `observed` seconds, shrunk toward `pooled`.
pub fn share(hitched: f64, observed: f64, pooled: f64) -> f64 {
    ((hitched + PRIOR_SECONDS * pooled) / (observed + PRIOR_SECONDS)).clamp(1e-9, 1.0 - 1e-9)
}

/// The upstream's pooled share: all its streams' hitched seconds over their observed seconds,
/// shrunk toward [`PRIOR_SHARE`].
pub fn pooled(hitched: f64, observed: f64) -> f64 {
    share(hitched, observed, PRIOR_SHARE)
}

/// `P(X ≥ k)` for `X ~ Bin(n, p)`, summed in log space from `k` up until the terms no longer
/// matter (exact to about 1e-12 relative).
pub fn binomial_tail(n: usize, p: f64, k: usize) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let (ln_p, ln_q) = (p.ln(), (1.0 - p).ln());
    let mut ln_term = ln_choose(n, k) + k as f64 * ln_p + (n - k) as f64 * ln_q;
    let mut sum = 0.0f64;
    let ratio_base = ln_p - ln_q;
    for j in k..=n {
        let term = ln_term.exp();
        sum += term;
        if term < sum * 1e-15 && (j as f64) > n as f64 * p {
            break;
        }
        // term(j+1) / term(j) = (n - j) / (j + 1) · p / q
        if j < n {
            ln_term += ((n - j) as f64).ln() - ((j + 1) as f64).ln() + ratio_base;
        }
    }
    sum.min(1.0)
}

/// `ln C(n, k)`, summed over the smaller side.
fn ln_choose(n: usize, k: usize) -> f64 {
    let k = k.min(n - k);
    (0..k)
        .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
        .sum()
}

/// The verdict on `k` of `n` streams inside a hitch at once when independence predicts `lambda`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// `λ`, the streams independence predicts inside a hitch at once.
    pub lambda: f64,
    /// The binomial tail bound on `P(k or more by chance)`.
    pub bound: f64,
    /// Whether the co-stall is rare enough to be an episode.
    pub rare: bool,
}

/// Judges `k` of `n` streams inside a hitch at once, given the sum of their chances `lambda`.
pub fn judge(n: usize, k: usize, lambda: f64, false_positive: f64) -> Verdict {
    if n == 0 || (k as f64) < lambda + 1.0 {
        return Verdict {
            lambda,
            bound: 1.0,
            rare: false,
        };
    }
    let bound = binomial_tail(n, (lambda / n as f64).min(1.0), k);
    Verdict {
        lambda,
        bound,
        rare: bound <= false_positive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The exact Poisson-binomial tail `P(X ≥ k)` by dynamic programming.
    fn poisson_binomial_tail(ps: &[f64], k: usize) -> f64 {
        let mut dist = vec![1.0f64];
        for &p in ps {
            let mut next = vec![0.0; dist.len() + 1];
            for (j, &d) in dist.iter().enumerate() {
                next[j] += d * (1.0 - p);
                next[j + 1] += d * p;
            }
            dist = next;
        }
        dist.iter().skip(k).sum()
    }

    #[test]
    fn the_binomial_tail_is_exact() {
        assert!((binomial_tail(4, 0.1, 4) - 1e-4).abs() < 1e-15);
        assert!(
            (binomial_tail(4, 0.1, 2) - (1.0 - 0.9f64.powi(4) - 0.4 * 0.9f64.powi(3))).abs()
                < 1e-12
        );
        assert_eq!(binomial_tail(3, 0.5, 0), 1.0);
        assert_eq!(binomial_tail(3, 0.5, 4), 0.0);
        let ps = vec![0.3; 12];
        for k in 0..=12 {
            let exact = poisson_binomial_tail(&ps, k);
            assert!((binomial_tail(12, 0.3, k) - exact).abs() < 1e-12, "{k}");
        }
    }

    #[test]
    fn two_of_four_independent_stallers_are_chance_four_fresh_streams_are_not() {
        // Four streams each inside a stall of its own 10 % of the time: two at once is common.
        assert!(!judge(4, 2, 0.4, 1e-6).rare);
        assert!(!judge(4, 4, 0.4, 1e-6).rare, "1e-4 is not rare enough");
        // Four streams at the prior share, all inside at once: 1.6e-7.
        let v = judge(4, 4, 4.0 * PRIOR_SHARE, 1e-6);
        assert!(v.rare, "{v:?}");
        // Six decoding streams of a real engine, all at once.
        assert!(judge(6, 6, 6.0 * 0.05, 1e-6).rare);
    }

    #[test]
    fn shares_shrink_toward_the_pool() {
        let pool = pooled(0.0, 0.0);
        assert!((pool - PRIOR_SHARE).abs() < 1e-12);
        // A stream seen for 30 s with 3 s inside stalls: near 10 %.
        let s = share(3.0, 30.0, pool);
        assert!((0.08..0.1).contains(&s), "{s}");
        let mut d = Decayed::default();
        d.add(0, 1.0, 30.0);
        assert!((d.at(30_000_000_000, 30.0) - (-1.0f64).exp()).abs() < 1e-12);
        assert!((observed(0, 30_000_000_000, 30.0) - 30.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-9);
    }

    proptest! {
        /// Hoeffding: for `k ≥ λ + 1` the binomial tail with the same mean is at least the
        /// Poisson-binomial tail, whatever the streams' chances.
        #[test]
        fn the_bound_is_at_least_the_exact_tail(
            ps in proptest::collection::vec(0.0005f64..0.6, 1..40),
            extra in 1usize..40,
        ) {
            let n = ps.len();
            let lambda: f64 = ps.iter().sum();
            let k = ((lambda + 1.0).ceil() as usize + extra - 1).min(n);
            prop_assume!(k as f64 >= lambda + 1.0);
            let exact = poisson_binomial_tail(&ps, k);
            let bound = binomial_tail(n, lambda / n as f64, k);
            prop_assert!(bound >= exact * (1.0 - 1e-9) - 1e-300, "bound {bound} exact {exact}");
        }
    }
}
