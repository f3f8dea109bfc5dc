//! Raising the open-file limit: every concurrent stream holds a socket, and the default soft
//! limit (often 1024) would turn a 10,000-stream benchmark into a wall of connect errors.

// getrlimit/setrlimit through libc; each block says why it is sound.
#![allow(unsafe_code)]

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force
/// (`None` where the platform has no such limit or it cannot be read). Never fails the run: if
/// raising is refused, the old limit stays and streams beyond it fail (and count) as errors.
#[cfg(unix)]
pub fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            tracing::debug!(
                soft = limit.rlim_cur,
                hard = limit.rlim_max,
                "could not raise the open-file limit"
            );
        }
    }
    // rlim_t is u64 on Linux and macOS but not on every unix.
    #[allow(clippy::unnecessary_cast)]
    Some(limit.rlim_cur as u64)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (no such limit on this platform).
#[cfg(not(unix))]
pub fn raise_open_file_limit() -> Option<u64> {
    None
}
