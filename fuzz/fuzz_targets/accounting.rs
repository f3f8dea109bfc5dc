//! The token accountants, through the public `Accounting` API the proxy uses: every format's
//! accountant classifies arbitrary events, in a stream (state carried from event to event) or
//! alone, and never panics; an unparsed event is never a token event; a model name is borrowed
//! from the event.
//! Input: 1 byte picks the accountant, 1 byte the framing (SSE, NDJSON, or the rest as one
//! event), then the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::format::{Accounting, Classified};
use metronome::scan::{Event, EventSink, Framing, Scanner};

struct Classify<'a> {
    accounting: &'a mut Accounting,
}

impl EventSink for Classify<'_> {
    fn on_event(&mut self, event: Event<'_>) {
        let classified = self.accounting.classify(&event);
        check(&event, &classified);
    }

    #[cfg(format_list)]
    fn on_unknown_field(&mut self, name: &[u8], value: &[u8]) {
        let _ = self.accounting.unknown_field(name, value);
    }
}

fn check(event: &Event<'_>, c: &Classified<'_>) {
    if c.unparsed {
        assert!(!c.token_event, "an unparsed event counted as a token event");
    }
    if let Some(model) = c.model {
        let data = event.data.as_ptr_range();
        let m = model.as_bytes().as_ptr_range();
        assert!(
            data.start <= m.start && m.end <= data.end,
            "the model name is not borrowed from the event"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let [selector, mode, body @ ..] = data else {
        return;
    };
    let mut all = metronome_fuzz::accountants();
    let mut accounting = all.swap_remove(usize::from(*selector) % all.len());
    let _ = accounting.name();
    let framing = match mode % 3 {
        0 => Some(Framing::Sse),
        1 => Some(Framing::Ndjson),
        _ => None,
    };
    match framing {
        Some(framing) => {
            let mut scanner = Scanner::new(framing, 64 * 1024);
            let mut sink = Classify {
                accounting: &mut accounting,
            };
            scanner.feed(body, &mut sink);
            scanner.finish(&mut sink);
        }
        None => {
            for truncated in [false, true] {
                let event = Event {
                    kind: b"",
                    data: body,
                    truncated,
                };
                let classified = accounting.classify(&event);
                check(&event, &classified);
            }
        }
    }
    let _ = accounting.name();
});
