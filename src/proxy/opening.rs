//! A stream's opening: its ID, its beacon key and its place in the beacon window, and the two
//! response header values that carry them, made while the upstream works on the request rather
//! than after its answer arrived.
//!
//! Between the request's upstream write and the response head the proxy has nothing to do for
//! the request; everything done after the head, up to the client's first write, adds to the
//! time to first token. At one stream at a time, on a machine whose caches other processes
//! have taken in between, that time follows the memory touched more than the instructions run:
//! the beacon window's table alone (about 1 MB, keyed by stream ID) cost 13 µs there
//! (docs/perf-first-token.md). So what the head does not decide is made before it comes.
//!
//! The answer may not be a stream (a JSON answer, an error, no answer at all): the opening is
//! then dropped, which withdraws its slot from the window. The slot it took may have pushed the
//! window's oldest out meanwhile, as a stream would have.

use std::sync::Arc;

use http::HeaderValue;

use super::StreamIds;
use crate::timeline::{BeaconKey, StreamRegistry};

/// A stream's ID and beacon key, its slot taken in the beacon window; withdrawn when dropped
/// before [`Opening::keep`].
#[derive(Debug)]
pub struct Opening {
    opened: Opened,
    /// Where the slot was taken; `None` once kept.
    registry: Option<Arc<StreamRegistry>>,
}

/// What a kept opening gives the stream.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The stream's ID.
    pub id: Arc<str>,
    /// The ID as the response header's value.
    pub id_value: Option<HeaderValue>,
    /// The beacon key as the response header's value: only this response's client gets it, so
    /// only it can speak for the stream.
    pub key_value: Option<HeaderValue>,
}

// === impl Opening ===

impl Opening {
    /// Draws the ID and the key and takes the slot for a stream on `route`.
    pub fn new(ids: &StreamIds, registry: &Arc<StreamRegistry>, route: &Arc<str>) -> Self {
        let id: Arc<str> = Arc::from(ids.next());
        let key = BeaconKey(rand::random::<u128>());
        registry.started(&id, route, Some(key));
        Opening {
            opened: Opened {
                id_value: HeaderValue::from_str(&id).ok(),
                key_value: HeaderValue::from_str(&super::beacon::key_text(key)).ok(),
                id,
            },
            registry: Some(registry.clone()),
        }
    }

    /// The answer is a stream: its slot stays for its beacon.
    pub fn keep(mut self) -> Opened {
        self.registry = None;
        self.opened.clone()
    }
}

impl Drop for Opening {
    /// Not kept: the answer was no stream, so nothing may speak for it.
    fn drop(&mut self) {
        if let Some(registry) = self.registry.take() {
            registry.withdraw(&self.opened.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::BeaconClaim;

    fn registry() -> Arc<StreamRegistry> {
        Arc::new(StreamRegistry::new(8, 8))
    }

    /// The key a kept opening's header carries, read back as a beacon reads it.
    fn key_of(opened: &Opened) -> BeaconKey {
        let text = opened.key_value.as_ref().and_then(|v| v.to_str().ok());
        text.and_then(super::super::beacon::read_key)
            .expect("a key header")
    }

    #[test]
    fn a_kept_opening_lets_only_its_key_speak_for_the_stream() {
        let registry = registry();
        let opened = Opening::new(&StreamIds, &registry, &Arc::from("chat")).keep();
        let key = key_of(&opened);
        assert_eq!(opened.id_value.as_ref().unwrap(), &*opened.id);
        assert!(registry.beacon_slot(&opened.id, Some(key)).is_ok());
        let wrong = BeaconKey(key.0 ^ 1);
        assert_eq!(
            registry.beacon_slot(&opened.id, Some(wrong)).unwrap_err(),
            BeaconClaim::WrongKey
        );
    }

    #[test]
    fn an_opening_dropped_unkept_leaves_the_window() {
        let registry = registry();
        let route: Arc<str> = Arc::from("chat");
        let kept = Opening::new(&StreamIds, &registry, &route).keep();
        let dropped = Opening::new(&StreamIds, &registry, &route);
        let (id, key) = (dropped.opened.id.clone(), key_of(&dropped.opened));
        assert!(registry.beacon_slot(&id, Some(key)).is_ok());
        drop(dropped);
        assert_eq!(
            registry.beacon_slot(&id, Some(key)).unwrap_err(),
            BeaconClaim::Unknown
        );
        assert_eq!(registry.window_len(), (1, 1));
        assert!(registry.claim_beacon(&kept.id).is_ok());
    }
}
