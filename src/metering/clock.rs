//! Monotonic clock readings as whole nanoseconds, for the metering path.
//!
//! Every frame is stamped at ingress and at egress, and each stamp is compared with several
//! others: the previous token event (the gap), the frame's ingress stamp (the proxy delay) and the
//! start of the stream (its timeline). With `std::time::Instant` each comparison is a `timespec`
//! subtraction with its carry and checks, about 30 instructions; a [`Tick`] is one `i64`, read as
//! the time since a process-wide origin once per clock read, and compared by subtraction.
//! [`Tick::now`] reads `CLOCK_MONOTONIC` itself (the clock `Instant` reads on Linux) as
//! nanoseconds, where taking an `Instant` and subtracting the origin's cost a `timespec`
//! subtraction per reading (about 55 instructions, two readings per frame).
#![allow(unsafe_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A monotonic clock reading: nanoseconds since the process's clock origin (negative for an
/// `Instant` taken before it). Covers ±292 years.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(i64);

/// The process's clock origin, the first time anything asked for it: as `CLOCK_MONOTONIC`
/// nanoseconds, read first, and as an `Instant`, read just after. A reading of the clock is
/// counted from the first, an `Instant` from the second, so a reading taken after an `Instant`
/// is never earlier than it (it may be later by the few nanoseconds between the two reads).
struct Origin {
    raw: i64,
    instant: Instant,
}

impl Origin {
    /// The origin from `raw` and `instant`, read in that order (a struct literal's fields are
    /// evaluated in the order written, which a reordering would silently swap).
    fn read(raw: impl FnOnce() -> i64, instant: impl FnOnce() -> Instant) -> Origin {
        let raw = raw();
        let instant = instant();
        Origin { raw, instant }
    }
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| Origin::read(monotonic_nanos, Instant::now))
}

/// `CLOCK_MONOTONIC` as nanoseconds.
#[inline]
fn monotonic_nanos() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable `timespec` for the call's duration, and
    // CLOCK_MONOTONIC exists on every Linux (it cannot fail with these arguments).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    now.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec)
}

fn saturating_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

// === impl Tick ===

impl Tick {
    /// The clock now.
    #[inline]
    pub fn now() -> Tick {
        Tick(monotonic_nanos() - origin().raw)
    }

    /// The reading of `instant`.
    #[inline]
    pub fn from_instant(instant: Instant) -> Tick {
        let origin = origin().instant;
        match instant.checked_duration_since(origin) {
            Some(after) => Tick(saturating_nanos(after)),
            None => Tick(-saturating_nanos(origin.duration_since(instant))),
        }
    }

    /// The `Instant` of this reading (for timers, which take one).
    pub fn to_instant(self) -> Instant {
        let origin = origin().instant;
        let offset = Duration::from_nanos(self.0.unsigned_abs());
        if self.0 >= 0 {
            origin + offset
        } else {
            origin - offset
        }
    }

    /// Nanoseconds from `earlier` to this reading; 0 if `earlier` is later.
    #[inline]
    pub fn nanos_since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0).max(0) as u64
    }

    /// The time from `earlier` to this reading; zero if `earlier` is later.
    #[inline]
    pub fn saturating_duration_since(self, earlier: Tick) -> Duration {
        Duration::from_nanos(self.nanos_since(earlier))
    }

    /// Seconds from `earlier` to this reading; 0 if `earlier` is later.
    #[inline]
    pub fn secs_since(self, earlier: Tick) -> f64 {
        self.nanos_since(earlier) as f64 * 1e-9
    }

    /// Microseconds from `earlier` to this reading, saturating (a u32 covers 71 minutes).
    #[inline]
    pub fn micros_since(self, earlier: Tick) -> u32 {
        u32::try_from(self.nanos_since(earlier) / 1_000).unwrap_or(u32::MAX)
    }

    /// This reading moved on by `d`.
    pub fn saturating_add(self, d: Duration) -> Tick {
        Tick(self.0.saturating_add(saturating_nanos(d)))
    }
}

/// What the ingress side learned of one frame, carried with it until its bytes reach the client
/// socket: when it was read and what it held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameStamp {
    /// When the frame was read from the upstream.
    pub ingress: Tick,
    /// Events that ended in the frame.
    pub events: u32,
    /// Of those, events that carried tokens.
    pub token_events: u32,
    /// Their phases.
    pub mix: crate::format::PhaseMix,
    /// Place in the stream's timeline, when kept there.
    pub seq: Option<u32>,
}

impl FrameStamp {
    /// The stamp of a frame read at `ingress` and not metered yet: no counts.
    pub fn unmetered(ingress: Tick) -> FrameStamp {
        FrameStamp {
            ingress,
            events: 0,
            token_events: 0,
            mix: crate::format::PhaseMix::default(),
            seq: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_compare_as_the_instants_they_came_from() {
        let before_origin = Instant::now();
        let now = Tick::now();
        let earlier = Tick::from_instant(before_origin);
        assert!(earlier <= now);
        let later = now.saturating_add(Duration::from_millis(1500));
        assert_eq!(later.nanos_since(now), 1_500_000_000);
        assert_eq!(later.micros_since(now), 1_500_000);
        assert_eq!(later.secs_since(now), 1.5);
        assert_eq!(now.nanos_since(later), 0, "saturates, never negative");
        assert_eq!(
            later.saturating_duration_since(now),
            Duration::from_millis(1500)
        );

        // An Instant from before the origin reads negative and round-trips.
        let long_ago = before_origin - Duration::from_secs(3);
        let tick = Tick::from_instant(long_ago);
        assert_eq!(tick.to_instant(), long_ago);
        assert_eq!(
            Tick::from_instant(before_origin).saturating_duration_since(tick),
            Duration::from_secs(3)
        );
        let i = Instant::now() + Duration::from_nanos(123_456_789);
        assert_eq!(Tick::from_instant(i).to_instant(), i);
        assert_eq!(
            Tick::from_instant(i).nanos_since(Tick::from_instant(before_origin)),
            i.duration_since(before_origin).as_nanos() as u64
        );
        assert_eq!(Tick(0).micros_since(Tick(i64::MIN)), u32::MAX);
    }

    #[test]
    fn the_origin_reads_the_raw_clock_before_the_instant() {
        let order = std::cell::RefCell::new(Vec::new());
        let origin = Origin::read(
            || {
                order.borrow_mut().push("raw");
                7
            },
            || {
                order.borrow_mut().push("instant");
                Instant::now()
            },
        );
        assert_eq!(origin.raw, 7);
        assert_eq!(*order.borrow(), ["raw", "instant"]);
    }

    #[test]
    fn a_reading_after_an_instant_is_never_before_it_and_close_to_it() {
        for _ in 0..1_000 {
            let instant = Instant::now();
            let tick = Tick::now();
            let later = Instant::now();
            assert!(tick >= Tick::from_instant(instant));
            // Generous: the two clocks are one; only the origin's two reads stand between them.
            assert!(tick.nanos_since(Tick::from_instant(later)) < 1_000_000);
        }
        let a = Tick::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = Tick::now();
        assert!(b.nanos_since(a) >= 20_000_000);
    }
}
