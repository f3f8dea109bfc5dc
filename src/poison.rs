//! The lock-poisoning policy, said once.
//!
//! A `std::sync::Mutex` is poisoned when a thread panics while holding it. Every lock in
//! metronome guards counts, queues of finished work or a slot that each critical section leaves
//! whole at every point a panic could come from (none of them calls out to code that may panic
//! halfway through an update), so the data behind a poisoned lock is still sound: at worst one
//! observation is missing. Refusing it instead would turn one panicked task (already logged by
//! the panic hook) into a proxy whose metering, timelines or admin stop for good. So every lock
//! is taken through [`LockExt::lock_or_recover`], which takes the guard whether or not the lock
//! is poisoned. Where a poisoned lock must mean something else (the metered body reads it as
//! the end of its stream), the code says so beside the `lock()`.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] and [`Mutex::get_mut`] under metronome's poisoning policy (module docs).
pub trait LockExt<T: ?Sized> {
    /// The guard, whether or not another thread panicked while holding the lock.
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
    /// The data of a lock owned here, poisoned or not.
    fn get_mut_or_recover(&mut self) -> &mut T;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    #[inline]
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn get_mut_or_recover(&mut self) -> &mut T {
        self.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] under the same policy.
pub trait RwLockExt<T: ?Sized> {
    /// A read guard, poisoned or not.
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard, poisoned or not.
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    #[inline]
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_or_recover(), 7);
        let mut owned = std::sync::Arc::try_unwrap(m).unwrap();
        *owned.get_mut_or_recover() += 1;
        assert_eq!(*owned.lock_or_recover(), 8);
        let rw = std::sync::Arc::new(RwLock::new(1));
        let held = rw.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(rw.is_poisoned());
        *rw.write_or_recover() += 1;
        assert_eq!(*rw.read_or_recover(), 2);
    }
}
