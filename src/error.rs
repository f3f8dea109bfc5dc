//! Errors read by their types: the causes of an error, whether one of them is of a given type,
//! and the chain on one line for a person.
//!
//! Errors keep their types from where they happen to where they are answered or counted; code
//! that must know what went wrong asks here ([`is_caused_by`], [`find_cause`]) rather than
//! reading messages, as linkerd's `linkerd_error::is_caused_by` does.

use std::error::Error;
use std::fmt;

/// An error and its causes, the error itself first.
pub fn chain<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    let mut next = Some(error);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.source();
        Some(current)
    })
}

/// The first error of type `E` in the chain of `error` (itself or one of its causes).
pub fn find_cause<'a, E: Error + 'static>(error: &'a (dyn Error + 'static)) -> Option<&'a E> {
    chain(error).find_map(|e| e.downcast_ref::<E>())
}

/// Whether `error` is, or was caused by, an error of type `E`.
pub fn is_caused_by<E: Error + 'static>(error: &(dyn Error + 'static)) -> bool {
    find_cause::<E>(error).is_some()
}

/// Whether `error` says the connection was lost (reset, aborted, or closed early) rather than
/// that the peer sent something wrong: an I/O error of one of those kinds, or hyper's word for a
/// connection that closed before its message's end.
pub fn is_connection_lost(error: &(dyn Error + 'static)) -> bool {
    use std::io::ErrorKind;
    chain(error).any(|e| {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            );
        }
        e.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_incomplete_message() || h.is_closed() || h.is_canceled())
    })
}

/// An error and its causes on one line, `outer: inner: innermost` (hyper's top-level messages
/// alone say little).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, e) in chain(self.0).enumerate() {
            if n > 0 {
                f.write_str(": ")?;
            }
            fmt::Display::fmt(e, f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_cause_is_found_by_its_type_at_any_depth() {
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "inner",
        ));
        assert!(is_caused_by::<std::io::Error>(&error));
        assert!(is_caused_by::<Outer>(&error));
        assert!(!is_caused_by::<std::fmt::Error>(&error));
        assert!(is_connection_lost(&error));
        assert_eq!(Chain(&error).to_string(), "outer: inner");
    }

    #[test]
    fn an_error_of_another_kind_is_not_a_lost_connection() {
        let error = Outer(std::io::Error::new(std::io::ErrorKind::InvalidData, "bad"));
        assert!(!is_connection_lost(&error));
        assert_eq!(chain(&error).count(), 2);
    }
}
