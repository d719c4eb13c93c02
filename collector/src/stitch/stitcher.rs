//! Stitching one event at a time: events go in in time order; a request comes out
//! once every exchange of its chain has settled (its response ended, or its
//! connection closed, some time ago; or nothing moved on it for a long time). GPU
//! steps are joined to requests by the reader (`attribution::attribute`). Its exchanges are then released, and a connection with nothing
//! left on it once it closed (or went idle). Linking runs over what is still held,
//! so the cost of an advance follows the traffic in flight, not the history.

use super::conn::{ConnTracker, Connection, Conns, Exchange};
use super::{chain, request, Request};
use crate::ingest::fast_hash::{FastMap, FastSet};
use crate::ingest::Event;
use crate::protocol::limits::{Limit, MAX_CONNECTIONS};

/// When held things are let go (event time).
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    /// After a response ended (or its connection closed): late pieces (the close that
    /// rule 1 reads, a proxy's last write) arrive within this.
    pub settle_ns: u64,
    /// With nothing seen on a connection for this long, its exchanges are finalised
    /// as they are (a stream that never ended is truncated) and it is released.
    pub idle_ns: u64,
    /// Connections held at once. Past it (a flood of connections that stay open), the
    /// quietest are treated as idle now, down to half of it, and each is counted
    /// (`Limit::Connections`): memory stays bounded whatever the peers do.
    pub max_connections: usize,
}

impl Default for Settle {
    fn default() -> Settle {
        Settle {
            settle_ns: 2_000_000_000,
            idle_ns: 30_000_000_000,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// What an advance let go.
#[derive(Debug, Default)]
pub struct Settled {
    pub requests: Vec<Request>,
    /// The requests still held, as they stand (a live view shows them): not final,
    /// and without the upstream exchanges whose hop is not decided yet.
    pub open: Vec<Request>,
    /// Connections released, with the exchanges still on them: for tallies, and
    /// for views that draw connections (with `exchanges` let go before).
    pub connections: Vec<Connection>,
    /// Finalised exchanges let go from connections still held (connection id,
    /// exchange): their connection comes in a later `connections`.
    pub exchanges: Vec<(usize, Exchange)>,
}

pub struct Stitcher {
    settle: Settle,
    dropped: bool,
    conns: ConnTracker,
    /// Request ids by the exchange that roots their chain (connection id, request
    /// start, stream): stable across advances.
    ids: FastMap<(usize, u64, Option<u32>), usize>,
    next_id: usize,
    now_ns: u64,
    /// Requests still held are built at each advance (`Settled::open`): a live view
    /// shows them. A replay that only wants finished requests skips that work, which
    /// would otherwise build a long stream again at every advance.
    open_wanted: bool,
}

impl Stitcher {
    /// `dropped`: the recording lost events (every request is marked).
    pub fn new(settle: Settle, dropped: bool) -> Stitcher {
        Stitcher {
            settle,
            dropped,
            conns: ConnTracker::default(),
            ids: FastMap::default(),
            next_id: 0,
            now_ns: 0,
            open_wanted: true,
        }
    }

    /// Whether advances hand over the requests still held (`Settled::open`; yes unless
    /// told otherwise).
    pub fn with_open(mut self, wanted: bool) -> Stitcher {
        self.open_wanted = wanted;
        self
    }

    /// Whether the next advances hand over the requests still held.
    pub fn set_open(&mut self, wanted: bool) {
        self.open_wanted = wanted;
    }

    /// Connections held now (bounded by `Settle::max_connections` after an advance).
    pub fn held_connections(&self) -> usize {
        self.conns.conns.len()
    }

    /// The next socket event, in time order.
    pub fn push(&mut self, ev: &Event) {
        self.now_ns = self.now_ns.max(ev.ts_ns);
        self.conns.push(ev);
    }

    /// Time passed with no event (a live source that went quiet): what settled by
    /// `now_ns` can go at the next advance.
    pub fn pass_time(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    /// The earliest a request still held (or about to begin on a connection just
    /// opened) can start: a request starts at its first byte, or at connect() on the
    /// connection it opened. None: nothing is held. Readers that write in time order
    /// (the windowed export) wait for it to pass.
    pub fn oldest_held_ns(&self) -> Option<u64> {
        let fresh = self.now_ns.saturating_sub(self.settle.settle_ns);
        self.conns
            .conns
            .values()
            .filter_map(|c| {
                let opened = c.connect_ns.unwrap_or(c.first_ns).min(c.first_ns);
                let mut live = c.live_exchange_ids().peekable();
                match live.peek() {
                    Some(&0) => Some(opened),
                    Some(_) => live.map(|i| c.exchange(i).request_start_ns).min(),
                    // A connection that carried nothing yet may be about to (seen
                    // lately); one that stays quiet, or is not HTTP, holds nothing back.
                    None => (c.exchange_count() == 0 && c.first_ns >= fresh).then_some(opened),
                }
            })
            .min()
    }

    /// Lets go what settled by the latest event's time.
    pub fn advance(&mut self) -> Settled {
        self.settle_at(false)
    }

    /// The recording ended: everything held is finalised as it is.
    pub fn finish(&mut self) -> Settled {
        self.settle_at(true)
    }

    /// Past `max_connections`: connections quiet since this time are let go as if
    /// idle (the quietest, down to half the cap).
    fn crowded_from(&self) -> Option<u64> {
        let n = self.conns.conns.len();
        if n <= self.settle.max_connections {
            return None;
        }
        let mut last: Vec<u64> = self.conns.conns.values().map(|c| c.last_ns).collect();
        let k = n - self.settle.max_connections / 2;
        Some(*last.select_nth_unstable(k - 1).1)
    }

    fn settle_at(&mut self, all: bool) -> Settled {
        let now = self.now_ns;
        let crowded_from = self.crowded_from();
        let conns = &self.conns.conns;
        let idle_from = now.saturating_sub(self.settle.idle_ns);
        let crowded = |c: &Connection| crowded_from.is_some_and(|t| c.last_ns <= t);
        let ready = |(c, i): chain::End| {
            let c = &conns[&c];
            let x = c.exchange(i);
            all || x.sse.len() >= 3
                || x.response_end_ns.is_some()
                || c.close_ns.is_some()
                || c.last_ns <= idle_from
                || crowded(c)
        };
        let links = chain::link_ready(conns, &ready);
        let chains = chain::chains(conns, &links);
        let mut requests = Vec::with_capacity(chains.len());
        let mut done = Vec::with_capacity(chains.len());
        let mut roots = FastMap::with_capacity_and_hasher(chains.len(), Default::default());
        let mut keys = Vec::with_capacity(chains.len());
        let mut in_chain: FastSet<chain::End> = FastSet::default();
        for ch in &chains {
            let key = root_key(conns, ch[0]);
            keys.push(key);
            let id = *self.ids.entry(key).or_insert_with(|| {
                self.next_id += 1;
                self.next_id - 1
            });
            roots.insert(key, id);
            let subs = ch.iter().filter_map(|e| links.subrequests.get(e)).flatten();
            let ends: Vec<chain::End> = ch.iter().chain(subs).copied().collect();
            let d = all
                || ends
                    .iter()
                    .all(|&e| !links.undecided.contains(&e) && self.settled(e, now, crowded_from));
            requests.push(
                (d || self.open_wanted)
                    .then(|| request::build(id, conns, ch, &links, self.dropped)),
            );
            done.push(d);
            in_chain.extend(ends);
        }
        // A root that no longer starts a chain (its hop was joined meanwhile) gives up its id.
        self.ids.retain(|k, _| roots.contains_key(k));

        let mut out = Settled::default();
        // Finalised: their exchanges (and sub-requests) retire.
        let mut retire: Vec<(usize, usize)> = Vec::new();
        for (ch, d) in chains.iter().zip(&done) {
            if *d {
                retire.extend(ch);
                retire.extend(ch.iter().filter_map(|e| links.subrequests.get(e)).flatten());
            }
        }
        for (((r, d), key), ch) in requests.into_iter().zip(done).zip(keys).zip(&chains) {
            let Some(r) = r else { continue }; // held, and not wanted while held
            if d {
                self.ids.remove(&key);
                out.requests.push(r);
            } else if !(links.undecided.contains(&ch[0])
                && conns[&ch[0].0].role == super::conn::Role::Client)
            {
                out.open.push(r);
            }
        }
        for (c, i) in retire {
            if let Some(c) = self.conns.conns.get_mut(&c) {
                c.exchange_mut(i).retired = true;
            }
        }
        self.release(now, all, crowded_from, &in_chain, &mut out);
        out
    }

    /// Requests being served now, one `(pid, comm)` per request: each exchange a process
    /// accepted whose response has not ended (nor its connection closed, nor a later
    /// request followed it on its connection). Counted where it was accepted, whatever
    /// the hops are joined to yet: a proxy that buffers a response holds its client's
    /// request undecided until the end, and it is in flight all the while.
    pub fn serving(&self) -> impl Iterator<Item = (u32, &str)> + '_ {
        self.conns
            .conns
            .values()
            .filter(|c| c.role == super::conn::Role::Server)
            .flat_map(move |c| {
                c.live_exchange_ids()
                    .filter(move |&i| self.ended((c.id, i)).is_none())
                    .map(move |_| (c.pid, c.comm.as_str()))
            })
    }

    /// Whether an exchange is over: its response ended (or its connection closed) a
    /// settle ago, or nothing moved on its connection for the idle time (or since
    /// `crowded_from`).
    fn settled(&self, (c, i): chain::End, now: u64, crowded_from: Option<u64>) -> bool {
        let ended = self.ended((c, i));
        let c = &self.conns.conns[&c];
        ended.is_some_and(|t| t.saturating_add(self.settle.settle_ns) <= now)
            || c.last_ns.saturating_add(self.settle.idle_ns) <= now
            || crowded_from.is_some_and(|t| c.last_ns <= t)
    }

    /// When an exchange's response was over, if it is: its end, its connection's
    /// close, or (HTTP/1) the last moment before a later request on its connection
    /// (encrypted exchanges never see an end of their own).
    fn ended(&self, (c, i): chain::End) -> Option<u64> {
        let c = &self.conns.conns[&c];
        let x = c.exchange(i);
        x.response_end_ns.or(c.close_ns).or_else(|| {
            (x.stream_id.is_none() && i + 1 < c.exchange_count()).then(|| last_moment(x))
        })
    }

    /// Releases retired exchanges, then connections with nothing left that closed a
    /// settle ago or went idle; exchanges that joined no request go with them.
    fn release(
        &mut self,
        now: u64,
        all: bool,
        crowded_from: Option<u64>,
        in_chain: &FastSet<chain::End>,
        out: &mut Settled,
    ) {
        let settle = self.settle;
        let exchanges = &mut out.exchanges;
        let gone: Vec<usize> = self
            .conns
            .conns
            .values_mut()
            .filter_map(|c| {
                let over = all
                    || c.close_ns
                        .is_some_and(|t| t.saturating_add(settle.settle_ns) <= now)
                    || c.last_ns.saturating_add(settle.idle_ns) <= now;
                let crowded = crowded_from.is_some_and(|t| c.last_ns <= t);
                // Exchanges in no chain (a role never known, a client seen only as TLS
                // records whose server end told the request) go when their connection does.
                if (over || crowded)
                    && c.live_exchange_ids()
                        .all(|i| !in_chain.contains(&(c.id, i)))
                {
                    if !over {
                        c.limits[Limit::Connections as usize] += 1;
                    }
                    return Some(c.id);
                }
                let id = c.id;
                exchanges.extend(c.release_retired().into_iter().map(|x| (id, x)));
                None
            })
            .collect();
        out.connections = gone
            .into_iter()
            .filter_map(|id| self.conns.release(id))
            .collect();
    }
}

fn last_moment(x: &Exchange) -> u64 {
    [
        Some(x.request_start_ns),
        x.request_end_ns,
        x.response_first_ns,
        x.response_end_ns,
        x.sse.last().map(|e| e.ts_ns),
        x.records_ns.last().copied(),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0)
}

fn root_key(conns: &Conns, (c, i): chain::End) -> (usize, u64, Option<u32>) {
    let x = conns[&c].exchange(i);
    (c, x.request_start_ns, x.stream_id)
}
