//! Cache prefetch hints for a stream's per-frame metering state.
//!
//! With many streams open, a stream's state (its ledgers, sketches, template and timeline) has
//! left the core's caches by the time its next frame comes: each of the other streams' frames in
//! between went through the same core. The metered body asks for those lines just before it
//! reads the upstream socket, so that they arrive while the kernel copies the frame, instead of
//! each one stalling the metering that follows the read.
//!
//! A prefetch is only a hint: it never faults, reads no value and changes nothing the program
//! can observe but its timing, so any address may be given. On targets without a prefetch
//! instruction these functions do nothing.

// The prefetch intrinsics are `unsafe`; each block says why it is sound.
#![allow(unsafe_code)]

/// The cache line size assumed for stepping through a value.
const LINE: usize = 64;

/// Asks for the cache line that holds `address`.
#[inline(always)]
pub fn line<T: ?Sized>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is part of SSE, which every x86_64 processor has; it reads nothing the
    // program sees and never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Asks for every cache line of `slice`'s elements.
#[inline(always)]
pub fn slice<T>(slice: &[T]) {
    for_each_line(
        slice.as_ptr().cast::<u8>(),
        std::mem::size_of_val(slice),
        line,
    );
}

/// Asks for every cache line of `value` itself (not of what it points to).
#[inline(always)]
pub fn value<T>(value: &T) {
    slice(std::slice::from_ref(value));
}

/// Calls `f` with one address in each cache line that `len` bytes from `start` touch: every
/// [`LINE`] bytes from `start`, then the last byte, whose line the steps miss when `start` is not
/// at a line's start. A plain loop, which the compiler unrolls for a value's known size.
#[inline(always)]
fn for_each_line(start: *const u8, len: usize, mut f: impl FnMut(*const u8)) {
    if len == 0 {
        return;
    }
    let mut offset = 0;
    while offset < len {
        f(start.wrapping_add(offset));
        offset += LINE;
    }
    f(start.wrapping_add(len - 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_address_is_a_valid_hint() {
        // Dangling, null and unaligned addresses are hints like any other: none may fault.
        line(std::ptr::null::<u8>());
        line(usize::MAX as *const u8);
        slice::<u8>(&[]);
        let local = [7u8; 300];
        value(&local);
        slice(&local[1..]);
        assert_eq!(local, [7u8; 300]);
    }

    /// The cache lines (by index) that the hints for `len` bytes from `start` ask for.
    fn lines_asked(start: usize, len: usize) -> std::collections::BTreeSet<usize> {
        let mut lines = std::collections::BTreeSet::new();
        for_each_line(start as *const u8, len, |address| {
            lines.insert(address as usize / LINE);
        });
        lines
    }

    #[test]
    fn every_line_a_range_touches_is_asked_for_and_no_other() {
        for start in [0, 1, 63, 64, 100, 4095] {
            for len in [0, 1, 2, 63, 64, 65, 127, 128, 129, 230, 632, 1024] {
                let touched: std::collections::BTreeSet<usize> =
                    (start..start + len).map(|byte| byte / LINE).collect();
                assert_eq!(lines_asked(start, len), touched, "start {start}, len {len}");
            }
        }
        // A line's worth from a line's middle spans two lines; both are asked for.
        assert_eq!(lines_asked(96, 64).len(), 2);
    }
}
