//! The streams of one upstream silent past their threshold, in the order they fell silent, with
//! removal in O(1): a stream that leaves keeps its place as a stale entry (its slot no longer
//! holds that entry's number) until the list is compacted, which happens once stale entries
//! outnumber live ones, so each removal costs O(1) amortised and the order of the live entries
//! is the order in which they entered (the order an episode names its streams in).
//!
//! The list knows nothing of slots: the tracker says which entries are still valid.

/// One place in the list: the stream's key and the entry's number (unique over the list's life).
pub type Entry = (u64, u64);

/// The ordered list of silent streams (see the module's comment).
#[derive(Debug, Default)]
pub struct SilentList {
    order: Vec<Entry>,
    /// Live entries (the rest of `order` is stale).
    live: usize,
    /// The number the next entry gets (from 1; 0 is never an entry's).
    next: u64,
}

// === impl SilentList ===

impl SilentList {
    /// Stream `key` fell silent: appended; returns its entry's number, for its slot to hold.
    pub fn enter(&mut self, key: u64) -> u64 {
        self.next += 1;
        self.order.push((key, self.next));
        self.live += 1;
        self.next
    }

    /// A live entry left (its slot no longer holds its number). With no live entry left, the
    /// stale ones go at once.
    pub fn leave(&mut self) {
        self.live = self.live.saturating_sub(1);
        if self.live == 0 {
            self.order.clear();
        }
    }

    /// Live entries: the streams silent now.
    pub fn len(&self) -> usize {
        self.live
    }

    /// No stream is silent.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Where the next entry will go: entries from here on entered after this call.
    pub fn mark(&self) -> usize {
        self.order.len()
    }

    /// The entries from place `from` on (stale ones included), in the order they entered.
    pub fn from(&self, from: usize) -> &[Entry] {
        self.order.get(from..).unwrap_or(&[])
    }

    /// Drops the stale entries once they outnumber the live ones (`valid` tells which are live),
    /// keeping the order; places from [`Self::mark`] are invalid after it.
    pub fn compact(&mut self, valid: impl Fn(Entry) -> bool) {
        if self.order.len() - self.live.min(self.order.len()) <= self.live {
            return;
        }
        self.order.retain(|&entry| valid(entry));
        self.live = self.order.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Property: whatever the entries and leaves, the live entries are in the order they
    /// entered, the list never holds more than twice the live ones plus one compaction's worth,
    /// and it is empty once none is live.
    #[test]
    fn property_live_entries_keep_their_order_and_the_list_stays_bounded() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..50 {
            let mut list = SilentList::default();
            // key → its live entry's number (what a slot holds).
            let mut held: HashMap<u64, u64> = HashMap::new();
            let mut entered: Vec<Entry> = Vec::new();
            for _ in 0..2_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = x % 64;
                if held.remove(&key).is_some() {
                    list.leave();
                } else {
                    let n = list.enter(key);
                    held.insert(key, n);
                    entered.push((key, n));
                }
                if x % 7 == 0 {
                    list.compact(|(k, n)| held.get(&k) == Some(&n));
                    assert!(
                        list.mark() <= 2 * list.len() + 1,
                        "{} {}",
                        list.mark(),
                        list.len()
                    );
                }
                assert_eq!(list.len(), held.len());
                let live: Vec<Entry> = (list.from(0).iter().copied())
                    .filter(|(k, n)| held.get(k) == Some(n))
                    .collect();
                let expected: Vec<Entry> = (entered.iter().copied())
                    .filter(|(k, n)| held.get(k) == Some(n))
                    .collect();
                assert_eq!(live, expected);
                if held.is_empty() {
                    assert_eq!(list.mark(), 0);
                }
            }
        }
    }
}
