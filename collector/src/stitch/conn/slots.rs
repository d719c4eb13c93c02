//! The connections of a recording by id, in slots.

use std::collections::VecDeque;

use super::Connection;

/// Every connection end of a recording (or still open in a live one), by id.
/// Ids count up in order of first sight, so iteration is in that order. A slot per id
/// from the oldest kept: an event's connection is found at its id's offset (a BTreeMap
/// lookup was ~4% of an export's main thread); boxed, so a slot released while an older
/// connection stays open costs a word.
#[derive(Clone, Debug, Default)]
pub struct Conns {
    /// The id of `slots[0]`.
    base: usize,
    slots: VecDeque<Option<Box<Connection>>>,
    len: usize,
}

impl Conns {
    pub fn get(&self, id: &usize) -> Option<&Connection> {
        let at = id.checked_sub(self.base)?;
        self.slots.get(at)?.as_deref()
    }

    pub fn get_mut(&mut self, id: &usize) -> Option<&mut Connection> {
        let at = id.checked_sub(self.base)?;
        self.slots.get_mut(at)?.as_deref_mut()
    }

    /// Puts `c` at `id` (its id), in place of any there.
    pub fn insert(&mut self, id: usize, c: Connection) {
        if self.slots.is_empty() {
            self.base = id;
        }
        while id < self.base {
            self.slots.push_front(None);
            self.base -= 1;
        }
        let at = id - self.base;
        if self.slots.len() <= at {
            self.slots.resize(at + 1, None);
        }
        if self.slots[at].replace(Box::new(c)).is_none() {
            self.len += 1;
        }
    }

    pub fn remove(&mut self, id: &usize) -> Option<Connection> {
        let at = id.checked_sub(self.base)?;
        let c = self.slots.get_mut(at)?.take()?;
        self.len -= 1;
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(*c)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// In id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Connection> + '_ {
        self.slots.iter().filter_map(|c| c.as_deref())
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Connection> + '_ {
        self.slots.iter_mut().filter_map(|c| c.as_deref_mut())
    }

    /// (id, connection) in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&usize, &Connection)> + '_ {
        self.values().map(|c| (&c.id, c))
    }
}

impl std::ops::Index<&usize> for Conns {
    type Output = Connection;

    fn index(&self, id: &usize) -> &Connection {
        self.get(id).expect("no connection of that id")
    }
}

impl FromIterator<(usize, Connection)> for Conns {
    fn from_iter<I: IntoIterator<Item = (usize, Connection)>>(iter: I) -> Conns {
        let mut conns = Conns::default();
        for (id, c) in iter {
            conns.insert(id, c);
        }
        conns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::model::Event;

    #[test]
    fn conns_find_keep_order_and_let_go_of_the_oldest_slots() {
        let conn = |id| Connection::new(id, &Event::default(), &Default::default());
        let mut conns: Conns = [7, 8, 9, 12].into_iter().map(|id| (id, conn(id))).collect();
        let ids = |c: &Conns| c.values().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(&conns), [7, 8, 9, 12]);
        assert_eq!((conns.len(), conns[&12].id), (4, 12));
        assert!(conns.get(&10).is_none() && conns.get(&3).is_none() && conns.get(&99).is_none());
        assert_eq!(conns.remove(&8).map(|c| c.id), Some(8));
        assert!(conns.remove(&8).is_none(), "once");
        assert_eq!(conns.remove(&7).map(|c| c.id), Some(7));
        assert_eq!((conns.base, conns.slots.len()), (9, 4), "7 and 8 let go");
        conns.insert(5, conn(5));
        conns.insert(13, conn(13));
        assert_eq!(ids(&conns), [5, 9, 12, 13]);
        assert_eq!(
            conns.iter().map(|(id, c)| (*id, c.id)).collect::<Vec<_>>(),
            [(5, 5), (9, 9), (12, 12), (13, 13)]
        );
        for id in [5, 9, 12, 13] {
            assert!(conns.remove(&id).is_some());
        }
        assert!(conns.is_empty() && conns.slots.is_empty());
    }
}
