//! Where the events of the reorder window wait: in the batch they came in. A batch
//! pushed whole (`Pipeline::push_batch`) is kept as it came, and single events
//! (`Pipeline::push`) are gathered in an open batch; the queue refers to an event by
//! (batch, index), and the event is fed where it lies. An event is a few hundred
//! bytes: moving each out of its batch and into a slot of a slab cost three copies an
//! event, ~15% of an export's main thread in cycles. A batch is let go once its last
//! event went through (and nothing is being added to it).

use crate::ingest::spares::SpareBatches;
use crate::ingest::Event;

/// Single events gathered per open batch.
const OPEN_EVENTS: usize = 1024;

#[derive(Default)]
pub(super) struct Held {
    batches: Vec<Batch>,
    /// Slots of `batches` free for the next batch.
    free: Vec<u32>,
    /// The batch single events go to.
    open: Option<u32>,
    /// Batches let go, for a source to fill again (`Pipeline::take_spare`): only once
    /// asked for.
    spares: Option<SpareBatches>,
}

#[derive(Default)]
struct Batch {
    events: Vec<Event>,
    /// Its events in the queue, not yet fed.
    waiting: u32,
    /// Events are still being added (the open batch, or one being pushed whole).
    filling: bool,
}

impl Held {
    /// Holds `events` whole, filling until `sealed`; its slot.
    pub(super) fn batch(&mut self, events: Vec<Event>) -> u32 {
        let slot = self.slot();
        self.batches[slot as usize] = Batch {
            events,
            waiting: 0,
            filling: true,
        };
        slot
    }

    /// Adds a single event to the open batch; its slot and index.
    pub(super) fn single(&mut self, event: Event) -> (u32, u32) {
        let slot = match self.open {
            Some(slot) if self.batches[slot as usize].events.len() < OPEN_EVENTS => slot,
            full => {
                if let Some(full) = full {
                    self.seal(full);
                }
                let slot = self.batch(Vec::with_capacity(OPEN_EVENTS));
                self.open = Some(slot);
                slot
            }
        };
        let b = &mut self.batches[slot as usize];
        b.events.push(event);
        (slot, (b.events.len() - 1) as u32)
    }

    pub(super) fn len(&self, slot: u32) -> usize {
        self.batches[slot as usize].events.len()
    }

    pub(super) fn ts_ns(&self, slot: u32, index: u32) -> u64 {
        self.batches[slot as usize].events[index as usize].ts_ns
    }

    /// One more of the batch's events is in the queue.
    pub(super) fn wait(&mut self, slot: u32) {
        self.batches[slot as usize].waiting += 1;
    }

    /// Single events go to a new batch from now on (the input paused or ended): the
    /// open one goes once its events are fed.
    pub(super) fn seal_open(&mut self) {
        if let Some(slot) = self.open.take() {
            self.seal(slot);
        }
    }

    /// Nothing more is added to the batch: it goes once its events are fed.
    pub(super) fn seal(&mut self, slot: u32) {
        let b = &mut self.batches[slot as usize];
        b.filling = false;
        if b.waiting == 0 {
            self.let_go(slot);
        }
    }

    /// The batch's events, taken out for a moment so that the caller can feed one of
    /// them while it changes itself (`put_back` returns them).
    pub(super) fn take(&mut self, slot: u32) -> Vec<Event> {
        std::mem::take(&mut self.batches[slot as usize].events)
    }

    /// Returns what `take` took; `fed`: one of its waiting events went through.
    pub(super) fn put_back(&mut self, slot: u32, events: Vec<Event>, fed: bool) {
        let b = &mut self.batches[slot as usize];
        // The empty vector `take` left needs no drop (a call per event otherwise).
        std::mem::forget(std::mem::replace(&mut b.events, events));
        if fed {
            b.waiting -= 1;
            if b.waiting == 0 && !b.filling {
                self.let_go(slot);
            }
        }
    }

    /// Events held, fed or not (tests: batches are let go).
    #[cfg(test)]
    pub(super) fn events(&self) -> usize {
        self.batches.iter().map(|b| b.events.len()).sum()
    }

    fn let_go(&mut self, slot: u32) {
        let events = std::mem::take(&mut self.batches[slot as usize].events);
        if let Some(spares) = &mut self.spares {
            spares.keep(events);
        }
        self.free.push(slot);
    }

    pub(super) fn keep_spares(&mut self) {
        self.spares.get_or_insert_with(SpareBatches::default);
    }

    /// Batches let go are kept with their events (`Pipeline::recycle_batches`).
    pub(super) fn keep_whole_spares(&mut self) {
        self.spares = Some(SpareBatches::whole());
    }

    pub(super) fn take_spare(&mut self) -> Option<Vec<Event>> {
        self.spares.as_mut()?.take(0)
    }

    fn slot(&mut self) -> u32 {
        match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.batches.push(Batch::default());
                u32::try_from(self.batches.len() - 1).expect("fewer than 2^32 batches waiting")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch goes to the spares once its last event went through and it is sealed,
    /// and only once they are asked for.
    #[test]
    fn batches_let_go_are_spares_only_when_asked() {
        let batch = || {
            let mut b = Vec::with_capacity(8);
            b.resize_with(2, Event::default);
            b
        };
        let mut held = Held::default();
        let slot = held.batch(batch());
        held.seal(slot);
        assert!(held.take_spare().is_none(), "not asked: dropped");
        held.keep_spares();
        let slot = held.batch(batch());
        held.wait(slot);
        held.seal(slot);
        assert!(held.take_spare().is_none(), "an event still waits");
        let events = held.take(slot);
        held.put_back(slot, events, true);
        let spare = held.take_spare().expect("let go, kept");
        assert!(spare.is_empty() && spare.capacity() >= 8);
    }
}
