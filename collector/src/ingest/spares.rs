//! Event batches done with, for a source to fill again: emptied with their room kept
//! for a live source, which hands over a batch per drain (a new one each time is fresh
//! pages, each a fault after `top`'s per-pass malloc_trim); kept whole for a recording,
//! whose reader writes the next frame over their events (`Source::recycle`). A few
//! cover the ones in flight.

use super::Event;

/// Batches kept, at most.
const KEPT: usize = 4;

#[derive(Default)]
pub struct SpareBatches {
    batches: Vec<Vec<Event>>,
    /// Batches are kept with their events (not emptied).
    whole: bool,
}

impl SpareBatches {
    /// Spares kept with their events as they are, for `Source::recycle`.
    pub fn whole() -> SpareBatches {
        SpareBatches {
            batches: Vec::new(),
            whole: true,
        }
    }

    /// Keeps `batch` (emptied unless `whole`) while fewer than a few wait (else it is
    /// dropped).
    pub fn keep(&mut self, mut batch: Vec<Event>) {
        if self.batches.len() < KEPT && batch.capacity() > 0 {
            if !self.whole {
                batch.clear();
            }
            self.batches.push(batch);
        }
    }

    /// A kept batch with room for `room` events at least.
    pub fn take(&mut self, room: usize) -> Option<Vec<Event>> {
        self.batches.pop().filter(|b| b.capacity() >= room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_batches_come_back_empty_with_their_room() {
        let mut spares = SpareBatches::default();
        for n in 0..6 {
            let mut b = Vec::with_capacity(64);
            b.resize_with(n, Event::default);
            spares.keep(b);
        }
        spares.keep(Vec::new());
        let mut back = Vec::new();
        while let Some(b) = spares.take(0) {
            back.push(b);
        }
        assert_eq!(back.len(), KEPT, "at most {KEPT} kept, none without room");
        assert!(back.iter().all(|b| b.is_empty() && b.capacity() >= 64));
        spares.keep(Vec::with_capacity(8));
        assert!(spares.take(64).is_none(), "too small for the room asked");
    }

    #[test]
    fn whole_spares_keep_their_events() {
        let mut spares = SpareBatches::whole();
        let mut b = Vec::with_capacity(8);
        b.resize_with(3, Event::default);
        spares.keep(b);
        let back = spares.take(0).expect("kept");
        assert_eq!(back.len(), 3, "its events as they were");
    }
}
