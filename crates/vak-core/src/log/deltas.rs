//! Bounds the delta events of one provider turn: a runaway provider that streams tens of millions of tiny deltas becomes a bounded number of events, not one event and ledger line each.
//!
//! The first `free` deltas of a turn (`FREE` in the agent: far more than any
//! real answer, and than `/burst` benchmarks send) pass through one by one,
//! so answers stream exactly as the provider sent them. Past that, consecutive
//! deltas of one kind are held and merged until they reach `CHUNK` bytes; a
//! change of kind or the end of the turn flushes what is held. Nothing is
//! dropped and the concatenated text is unchanged.

use crate::event::ClientEvent;
use crate::provider::ProviderEvent;

/// Deltas a turn publishes unmerged (the agent's setting).
pub(crate) const FREE: usize = 1_000_000;
/// The size a merged delta grows to before it is published.
pub(crate) const CHUNK: usize = 8 * 1024;

/// What one `push` publishes: up to two events, in order.
pub(crate) struct Ready([Option<ClientEvent>; 2]);

impl IntoIterator for Ready {
    type Item = ClientEvent;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<ClientEvent>, 2>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

pub(crate) struct Deltas {
    free: usize,
    seen: usize,
    held: Option<(bool, String)>,
}

fn event(thinking: bool, text: String) -> ClientEvent {
    if thinking {
        ClientEvent::ThinkingDelta { text }
    } else {
        ClientEvent::TextDelta { text }
    }
}

impl Deltas {
    pub(crate) fn new(free: usize) -> Deltas {
        Deltas {
            free,
            seen: 0,
            held: None,
        }
    }

    /// Takes one provider delta; returns the events to publish now, in order
    /// (at most two, in place: this runs once per delta).
    pub(crate) fn push(&mut self, e: ProviderEvent) -> Ready {
        let (thinking, text) = match e {
            ProviderEvent::Text(t) => (false, t),
            ProviderEvent::Thinking(t) => (true, t),
            // Not a delta: the caller routes signatures elsewhere.
            ProviderEvent::ThinkingSignature(_) => return Ready([self.flush(), None]),
        };
        self.seen += 1;
        if self.seen <= self.free {
            return Ready([Some(event(thinking, text)), None]);
        }
        let mut out = Ready([None, None]);
        match &mut self.held {
            Some((kind, held)) if *kind == thinking => held.push_str(&text),
            _ => {
                out.0[0] = self.flush();
                self.held = Some((thinking, text));
            }
        }
        if self.held.as_ref().is_some_and(|(_, h)| h.len() >= CHUNK) {
            out.0[1] = self.flush();
        }
        out
    }

    /// What is held, as one event (the turn ended or the kind changed).
    pub(crate) fn flush(&mut self) -> Option<ClientEvent> {
        self.held.take().map(|(thinking, text)| event(thinking, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(evs: &[ClientEvent]) -> String {
        evs.iter()
            .map(|e| match e {
                ClientEvent::TextDelta { text } | ClientEvent::ThinkingDelta { text } => text.as_str(),
                _ => "",
            })
            .collect()
    }

    #[test]
    fn a_short_answer_streams_delta_by_delta() {
        let mut d = Deltas::new(2048);
        let out: Vec<_> = ["echo: ", "hello ", "world"]
            .into_iter()
            .flat_map(|w| d.push(ProviderEvent::Text(w.into())))
            .collect::<Vec<_>>();
        assert_eq!(out.len(), 3);
        assert!(d.flush().is_none());
    }

    #[test]
    fn millions_of_deltas_become_thousands_of_events_with_the_same_text() {
        let mut d = Deltas::new(2048);
        let mut out = Vec::new();
        let mut expected = String::new();
        for i in 0..1_000_000 {
            let w = if i % 1000 == 999 {
                out.extend(d.push(ProviderEvent::Thinking("t ".into())));
                expected.push_str("t ");
                continue;
            } else {
                "a "
            };
            out.extend(d.push(ProviderEvent::Text(w.into())));
            expected.push_str(w);
        }
        out.extend(d.flush());
        assert!(out.len() < 5_000, "{} events", out.len());
        assert_eq!(text_of(&out), expected, "nothing lost, nothing reordered");
        let thinking = out
            .iter()
            .filter(|e| matches!(e, ClientEvent::ThinkingDelta { .. }))
            .count();
        assert_eq!(
            thinking, 1000,
            "a change of kind flushes: thinking stays where it was"
        );
    }
}
