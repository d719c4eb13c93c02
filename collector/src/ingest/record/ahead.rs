//! A recording read on its own thread: while the caller replays one batch, the next
//! ones are read, decompressed and decoded (a third of `report`'s work and a quarter of
//! `export`'s, measured with callgrind on a bench recording). The batches, errors and
//! end are the source's own, in its order: the thread calls `next_batch` as the caller
//! would, at most `AHEAD` calls early, so memory holds a few frames, not the recording.
//! A process that may run on one CPU only (taskset, a cgroup's quota) reads in the
//! caller's turn instead: the thread could only take turns with it, and the hand-over
//! cost 4-5% of a `report` on one core (the bench recording, 20 runs alternating).

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::{FileHeader, RecordError, Source};
use crate::ingest::Event;

/// Batches read before the caller asks (a frame is about a thousand events).
const AHEAD: usize = 4;

type Batch = Result<Option<Vec<Event>>, RecordError>;

pub struct ReadAhead {
    header: FileHeader,
    /// Read in the caller's turn (one CPU): no thread, no channel.
    inline: Option<Box<dyn Source + Send>>,
    batches: Option<Receiver<Batch>>,
    /// Batches the caller is done with, back to the thread (`Source::recycle`).
    recycled: Option<Sender<Vec<Event>>>,
    thread: Option<JoinHandle<()>>,
    /// The source ended (`Ok(None)`): it says so again without asking the thread.
    ended: bool,
}

impl ReadAhead {
    /// Starts reading `source` on a thread named `tokenscope-read`, or reads it in the
    /// caller's turn where this process has one CPU to run on.
    pub fn spawn(source: Box<dyn Source + Send>) -> std::io::Result<ReadAhead> {
        let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
        if one_cpu {
            return Ok(ReadAhead::inline(source));
        }
        ReadAhead::thread(source)
    }

    /// `source` read when asked, in the caller's turn.
    fn inline(source: Box<dyn Source + Send>) -> ReadAhead {
        ReadAhead {
            header: source.header().clone(),
            inline: Some(source),
            batches: None,
            recycled: None,
            thread: None,
            ended: false,
        }
    }

    fn thread(mut source: Box<dyn Source + Send>) -> std::io::Result<ReadAhead> {
        let header = source.header().clone();
        let (tx, rx) = mpsc::sync_channel::<Batch>(AHEAD);
        // At most one batch back per batch sent, taken before each read: bounded.
        let (back_tx, back_rx) = mpsc::channel::<Vec<Event>>();
        let thread = std::thread::Builder::new()
            .name("tokenscope-read".into())
            .spawn(move || loop {
                while let Ok(done) = back_rx.try_recv() {
                    source.recycle(done);
                }
                let batch = source.next_batch();
                let end = matches!(batch, Ok(None));
                // Sending fails once the reader is dropped: nobody is asking any more.
                // After an error the source is asked again, as its caller would: a
                // format 1-2 recording goes on at the next frame, a later format says
                // the same error again (the channel fills and the thread waits).
                if tx.send(batch).is_err() || end {
                    return;
                }
            })?;
        Ok(ReadAhead {
            header,
            inline: None,
            batches: Some(rx),
            recycled: Some(back_tx),
            thread: Some(thread),
            ended: false,
        })
    }
}

impl Source for ReadAhead {
    fn header(&self) -> &FileHeader {
        &self.header
    }

    fn next_batch(&mut self) -> Result<Option<Vec<Event>>, RecordError> {
        if self.ended {
            return Ok(None);
        }
        if let Some(source) = self.inline.as_mut() {
            let batch = source.next_batch();
            self.ended = matches!(batch, Ok(None));
            return batch;
        }
        let received = self.batches.as_ref().map(Receiver::recv);
        match received {
            Some(Ok(batch)) => {
                self.ended = matches!(batch, Ok(None));
                batch
            }
            // The thread is gone without saying the source ended: it panicked, and the
            // panic goes on here (as it would have without the thread).
            _ => {
                self.ended = true;
                if let Some(Err(panic)) = self.thread.take().map(JoinHandle::join) {
                    std::panic::resume_unwind(panic);
                }
                Ok(None)
            }
        }
    }

    /// To the source, in the caller's turn or on the reading thread (which takes it
    /// before its next read; dropped once the thread is gone).
    fn recycle(&mut self, batch: Vec<Event>) {
        if let Some(source) = self.inline.as_mut() {
            source.recycle(batch);
        } else if let Some(back) = &self.recycled {
            let _ = back.send(batch);
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // The receiver first: a thread waiting to send wakes to a closed channel.
        self.batches = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that says what it was scripted to, then panics if asked again.
    struct Scripted {
        header: FileHeader,
        script: std::vec::IntoIter<Batch>,
        panic_at_end: bool,
        /// The first time of each batch recycled.
        recycled: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl Source for Scripted {
        fn header(&self) -> &FileHeader {
            &self.header
        }

        fn next_batch(&mut self) -> Batch {
            match self.script.next() {
                Some(b) => b,
                None if self.panic_at_end => panic!("scripted panic"),
                None => Ok(None),
            }
        }

        fn recycle(&mut self, batch: Vec<Event>) {
            let first = batch.first().map_or(u64::MAX, |e| e.ts_ns);
            self.recycled.lock().expect("not poisoned").push(first);
        }
    }

    fn event(ts_ns: u64) -> Event {
        Event {
            ts_ns,
            ..Event::default()
        }
    }

    fn corrupt(offset: u64) -> RecordError {
        RecordError::CorruptFrame {
            path: "x.tsr".into(),
            offset,
            reason: "damaged".into(),
        }
    }

    /// Read on a thread, or `inline` in the caller's turn (as on one CPU).
    fn scripted(script: Vec<Batch>, panic_at_end: bool, inline: bool) -> ReadAhead {
        scripted_with(script, panic_at_end, inline, Default::default())
    }

    fn scripted_with(
        script: Vec<Batch>,
        panic_at_end: bool,
        inline: bool,
        recycled: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    ) -> ReadAhead {
        let header = FileHeader {
            host: "h".into(),
            ..FileHeader::default()
        };
        let source = Box::new(Scripted {
            header,
            script: script.into_iter(),
            panic_at_end,
            recycled,
        });
        if inline {
            ReadAhead::inline(source)
        } else {
            ReadAhead::thread(source).expect("thread")
        }
    }

    fn times(b: Batch) -> Vec<u64> {
        b.expect("a batch")
            .expect("not the end")
            .iter()
            .map(|e| e.ts_ns)
            .collect()
    }

    #[test]
    fn batches_errors_and_the_end_come_in_the_sources_order() {
        for inline in [false, true] {
            let script = vec![
                Ok(Some(vec![event(1), event(2)])),
                Err(corrupt(77)),
                Ok(Some(vec![event(3)])),
                Ok(None),
            ];
            let mut r = scripted(script, true, inline);
            assert_eq!(r.header().host, "h");
            assert_eq!(times(r.next_batch()), [1, 2]);
            match r.next_batch() {
                Err(RecordError::CorruptFrame { offset: 77, .. }) => {}
                other => panic!("expected the frame's error, got {:?}", other.map(|_| ())),
            }
            assert_eq!(times(r.next_batch()), [3]);
            // The end, and again: the source is not asked past its end (it would panic).
            assert!(matches!(r.next_batch(), Ok(None)));
            assert!(matches!(r.next_batch(), Ok(None)));
        }
    }

    #[test]
    fn batches_recycled_reach_the_source_inline_or_on_its_thread() {
        for inline in [false, true] {
            let recycled = std::sync::Arc::default();
            let script = (0..AHEAD as u64 * 4)
                .map(|i| Ok(Some(vec![event(i)])))
                .collect();
            let mut r = scripted_with(script, false, inline, std::sync::Arc::clone(&recycled));
            let first = r.next_batch().expect("a batch").expect("not the end");
            r.recycle(first);
            while r.next_batch().expect("a batch").is_some() {}
            let got = recycled.lock().expect("not poisoned").clone();
            assert_eq!(got, [0], "inline {inline}: the batch recycled, once");
        }
    }

    #[test]
    fn a_reader_dropped_early_stops_its_thread() {
        // More batches than are read ahead: the thread waits on a full channel until
        // the reader goes, then ends (drop joins it: this test would hang otherwise).
        let script = (0..AHEAD as u64 * 4)
            .map(|i| Ok(Some(vec![event(i)])))
            .collect();
        let mut r = scripted(script, false, false);
        assert_eq!(times(r.next_batch()), [0]);
        drop(r);
    }

    #[test]
    fn a_panic_while_reading_reaches_the_caller() {
        for inline in [false, true] {
            let mut r = scripted(vec![Ok(Some(vec![event(1)]))], true, inline);
            assert_eq!(times(r.next_batch()), [1]);
            let asked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.next_batch()));
            let panic = asked.map(|_| ()).expect_err("the source's panic");
            assert_eq!(panic.downcast_ref::<&str>(), Some(&"scripted panic"));
        }
    }
}
