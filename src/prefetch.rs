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

/// Asks for every cache line of `len` bytes from `start`.
#[inline(always)]
pub fn bytes(start: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let mut offset = 0;
    while offset < len {
        line(start.wrapping_add(offset));
        offset += LINE;
    }
    // The last byte's line, when `start` is not at a line's start.
    line(start.wrapping_add(len - 1));
}

/// Asks for every cache line of `value` itself (not of what it points to).
#[inline(always)]
pub fn value<T>(value: &T) {
    bytes((value as *const T).cast::<u8>(), std::mem::size_of::<T>());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_address_is_a_valid_hint() {
        // Dangling, null and unaligned addresses are hints like any other: none may fault.
        line(std::ptr::null::<u8>());
        line(usize::MAX as *const u8);
        bytes(std::ptr::NonNull::<u8>::dangling().as_ptr(), 4096);
        bytes(std::ptr::null(), 0);
        let local = [7u8; 300];
        value(&local);
        assert_eq!(local, [7u8; 300]);
    }
}
