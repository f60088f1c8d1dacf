//! What the quota streams may hold, in buckets and in bytes: per stream
//! (`--rlqs-max-buckets`, [`STREAM_BYTES`]), per connection and for the whole process, so
//! that many streams on one connection, many connections, or long bucket ids cannot grow
//! memory without bound. A bucket past a bound is left without an assignment (Envoy applies
//! its `no_assignment_behavior`); its stream stays open.
//!
//! One client cannot lock the others out: when the process is full, a bucket of a smaller
//! holder is still taken (within [`HEADROOM`]) and the largest connection owes the room it
//! took; its streams, woken at once ([`Holding::owing`]), give back their least active
//! buckets ([`Holding::owed`]), with `abandon_action`, which Envoy obeys.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::overload::ConnectionId;

/// A connection's streams together hold at most this many times `--rlqs-max-buckets`
/// (Envoy opens one stream per domain, so two full domains fit).
pub const CONNECTION_STREAMS: usize = 2;
/// The process holds at most this many times `--rlqs-max-buckets` (200,000 by default).
pub const PROCESS_STREAMS: usize = 20;
/// Most bytes one stream's buckets may take: 10,000 buckets with ids of up to 1.6 KiB.
pub const STREAM_BYTES: usize = 16 << 20;
/// Most bytes one connection's streams may take together: one full stream.
pub const CONNECTION_BYTES: usize = 16 << 20;
/// Most bytes every stream of the process may take together: 16 full connections.
pub const PROCESS_BYTES: usize = 256 << 20;
/// What a bucket takes beside its id's text: its state (three fairness counters, what is
/// pending, what was sent), its index entry, its rule and its keys.
pub const BUCKET_BYTES: usize = 1024;
/// What each pair of an id takes beside its text (two strings and their allocations).
pub const PAIR_BYTES: usize = 64;
/// Past the process bound, buckets of smaller holders are still taken up to this part more
/// (an eighth), while the largest holder gives its room back.
pub const HEADROOM: usize = 8;

/// Buckets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Buckets.
    pub buckets: usize,
    /// Bytes.
    pub bytes: usize,
}

impl Load {
    fn fits(self, more: Load, most: Load) -> bool {
        self.buckets + more.buckets <= most.buckets && self.bytes + more.bytes <= most.bytes
    }

    fn add(&mut self, more: Load) {
        self.buckets += more.buckets;
        self.bytes += more.bytes;
    }

    fn sub(&mut self, less: Load) {
        self.buckets = self.buckets.saturating_sub(less.buckets);
        self.bytes = self.bytes.saturating_sub(less.bytes);
    }

    /// The bound `most` with [`HEADROOM`] added.
    fn with_headroom(most: Load) -> Load {
        Load {
            buckets: most.buckets + most.buckets / HEADROOM,
            bytes: most.bytes + most.bytes / HEADROOM,
        }
    }
}

/// What one bucket of `pairs` with `text` bytes of keys and values takes.
pub fn bucket_load(pairs: usize, text: usize) -> Load {
    Load {
        buckets: 1,
        bytes: BUCKET_BYTES + pairs * PAIR_BYTES + text,
    }
}

/// What the streams hold, per connection and in all.
#[derive(Debug)]
pub struct BucketBounds {
    stream: Load,
    connection: Load,
    process: Load,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: Load,
    connections: HashMap<ConnectionId, Holder>,
}

/// One connection's hold, and the bytes it owes to a smaller holder.
#[derive(Debug)]
struct Holder {
    load: Load,
    streams: usize,
    owed: Arc<AtomicUsize>,
    /// Counts the debts it was handed, and wakes its streams on each.
    debts: watch::Sender<u64>,
}

impl Default for Holder {
    fn default() -> Self {
        Holder {
            load: Load::default(),
            streams: 0,
            owed: Arc::default(),
            debts: watch::Sender::new(0),
        }
    }
}

/// Which bound a bucket met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `--rlqs-max-buckets` or [`STREAM_BYTES`] of its stream.
    Stream,
    /// Its connection's share.
    Connection,
    /// The process's.
    Process,
}

impl BucketBounds {
    /// Bounds for `per_stream` buckets a stream.
    pub fn new(per_stream: usize) -> BucketBounds {
        BucketBounds::with_bytes(per_stream, [STREAM_BYTES, CONNECTION_BYTES, PROCESS_BYTES])
    }

    /// Bounds for `per_stream` buckets a stream, and `bytes` per stream, connection and
    /// process.
    pub fn with_bytes(per_stream: usize, bytes: [usize; 3]) -> BucketBounds {
        let load = |buckets: usize, bytes: usize| Load { buckets, bytes };
        BucketBounds {
            stream: load(per_stream, bytes[0]),
            connection: load(per_stream.saturating_mul(CONNECTION_STREAMS), bytes[1]),
            process: load(per_stream.saturating_mul(PROCESS_STREAMS), bytes[2]),
            held: Mutex::new(Held::default()),
        }
    }

    /// What every stream holds now.
    pub fn total(&self) -> Load {
        self.held.lock().total
    }
}

/// One stream's hold on the bounds; gives its buckets back when dropped.
#[derive(Debug)]
pub struct Holding {
    bounds: Arc<BucketBounds>,
    connection: Option<ConnectionId>,
    /// The bytes its connection owes (shared by the connection's streams).
    owed: Arc<AtomicUsize>,
    /// Told of each debt handed to its connection.
    debts: watch::Receiver<u64>,
    held: Load,
}

impl Holding {
    /// A stream holding nothing yet, on `connection` when known.
    pub fn new(bounds: Arc<BucketBounds>, connection: Option<ConnectionId>) -> Holding {
        let (owed, debts) = match connection {
            Some(connection) => {
                let mut held = bounds.held.lock();
                let holder = held.connections.entry(connection).or_default();
                holder.streams += 1;
                (Arc::clone(&holder.owed), holder.debts.subscribe())
            }
            // Never owes: only connections are asked for room.
            None => (Arc::default(), watch::Sender::new(0).subscribe()),
        };
        Holding {
            bounds,
            connection,
            owed,
            debts,
            held: Load::default(),
        }
    }

    /// Takes one more bucket of `load`, or says which bound it would pass.
    pub fn take(&mut self, load: Load) -> Result<(), Bound> {
        let bounds = Arc::clone(&self.bounds);
        if !self.held.fits(load, bounds.stream) {
            return Err(Bound::Stream);
        }
        let mut held = bounds.held.lock();
        let on_connection = self
            .connection
            .and_then(|connection| held.connections.get(&connection))
            .map(|holder| holder.load)
            .unwrap_or(self.held);
        if !on_connection.fits(load, bounds.connection) {
            return Err(Bound::Connection);
        }
        if !held.total.fits(load, bounds.process) {
            let room = Load::with_headroom(bounds.process);
            if !held.total.fits(load, room) || !held.make_room(on_connection, load) {
                return Err(Bound::Process);
            }
        }
        held.total.add(load);
        if let Some(holder) = self
            .connection
            .and_then(|connection| held.connections.get_mut(&connection))
        {
            holder.load.add(load);
        }
        self.held.add(load);
        Ok(())
    }

    /// Gives back one bucket of `load`; it pays off what the connection owes first.
    pub fn release(&mut self, load: Load) {
        let load = Load {
            buckets: load.buckets.min(self.held.buckets),
            bytes: load.bytes.min(self.held.bytes),
        };
        self.held.sub(load);
        let _ = self
            .owed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |owed| {
                Some(owed.saturating_sub(load.bytes))
            });
        let mut held = self.bounds.held.lock();
        held.total.sub(load);
        if let Some(holder) = self
            .connection
            .and_then(|connection| held.connections.get_mut(&connection))
        {
            holder.load.sub(load);
        }
    }

    /// Resolves when the stream's connection was handed a debt since the stream last
    /// looked (never without a connection): the stream then gives back what it can at
    /// once, however long it would sleep otherwise.
    pub async fn owing(&mut self) {
        super::next_change(&mut self.debts).await;
    }

    /// Bytes the stream's connection owes to smaller holders: its streams give back their
    /// least active buckets until it owes nothing. A debt ends once the process is back
    /// within its bound, whoever gave the room back.
    pub fn owed(&self) -> usize {
        if self.owed.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        if self
            .bounds
            .total()
            .fits(Load::default(), self.bounds.process)
        {
            self.owed.store(0, Ordering::Relaxed);
        }
        self.owed.load(Ordering::Relaxed)
    }
}

impl Held {
    /// Past the process bound, makes a holder of `own` (the taker's connection) owe the
    /// room for `load` to the largest holder that holds more than it would: true when
    /// one does.
    fn make_room(&mut self, own: Load, load: Load) -> bool {
        // What a holder still holds past what it already owes: a debt never exceeds a hold.
        let unowed = |holder: &Holder| {
            let owed = holder.owed.load(Ordering::Relaxed);
            holder.load.bytes.saturating_sub(owed)
        };
        let largest = self
            .connections
            .values()
            .max_by_key(|holder| unowed(holder))
            .filter(|holder| unowed(holder) > own.bytes + load.bytes);
        match largest {
            Some(holder) => {
                holder.owed.fetch_add(load.bytes, Ordering::Relaxed);
                holder.debts.send_modify(|debts| *debts += 1);
                true
            }
            None => false,
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.release(self.held);
        if let Some(connection) = self.connection {
            let mut held = self.bounds.held.lock();
            if let Some(holder) = held.connections.get_mut(&connection) {
                holder.streams -= 1;
                if holder.streams == 0 {
                    held.connections.remove(&connection);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overload::ConnectionLoad;

    const ONE: Load = Load {
        buckets: 1,
        bytes: 1000,
    };

    #[test]
    fn streams_connections_and_the_process_are_bounded_and_give_back_on_drop() {
        let bounds = Arc::new(BucketBounds::new(2));
        let one = ConnectionLoad::default().id();
        let mut streams: Vec<Holding> = (0..CONNECTION_STREAMS + 1)
            .map(|_| Holding::new(Arc::clone(&bounds), Some(one)))
            .collect();
        for stream in &mut streams[..CONNECTION_STREAMS] {
            assert_eq!(stream.take(ONE), Ok(()));
            assert_eq!(stream.take(ONE), Ok(()));
            assert_eq!(stream.take(ONE), Err(Bound::Stream));
        }
        assert_eq!(
            streams[CONNECTION_STREAMS].take(ONE),
            Err(Bound::Connection)
        );
        streams[0].release(ONE);
        assert_eq!(streams[CONNECTION_STREAMS].take(ONE), Ok(()));
        streams.clear();
        assert_eq!(bounds.total(), Load::default());
        assert!(bounds.held.lock().connections.is_empty());
    }

    #[test]
    fn bytes_are_bounded_per_stream_and_per_connection() {
        let bounds = Arc::new(BucketBounds::with_bytes(100, [5000, 8000, 100_000]));
        let one = ConnectionLoad::default().id();
        let mut first = Holding::new(Arc::clone(&bounds), Some(one));
        let mut second = Holding::new(Arc::clone(&bounds), Some(one));
        for _ in 0..5 {
            assert_eq!(first.take(ONE), Ok(()));
        }
        assert_eq!(first.take(ONE), Err(Bound::Stream));
        for _ in 0..3 {
            assert_eq!(second.take(ONE), Ok(()));
        }
        assert_eq!(second.take(ONE), Err(Bound::Connection));
    }

    #[test]
    fn a_full_process_takes_a_newcomers_bucket_and_the_largest_holder_owes_it() {
        let bounds = Arc::new(BucketBounds::with_bytes(100, [20_000, 20_000, 16_000]));
        let (big, small) = (
            ConnectionLoad::default().id(),
            ConnectionLoad::default().id(),
        );
        let mut hog = Holding::new(Arc::clone(&bounds), Some(big));
        let mut other = Holding::new(Arc::clone(&bounds), Some(ConnectionLoad::default().id()));
        for _ in 0..10 {
            hog.take(ONE).unwrap();
        }
        for _ in 0..6 {
            other.take(ONE).unwrap();
        }
        // Full: a newcomer's bucket is still taken, and the largest holder owes its room.
        let mut newcomer = Holding::new(Arc::clone(&bounds), Some(small));
        assert_eq!(newcomer.take(ONE), Ok(()));
        assert_eq!((hog.owed(), other.owed(), newcomer.owed()), (1000, 0, 0));
        // Its streams are woken for it, however long they would sleep; the others are not.
        assert!(hog.debts.has_changed().unwrap());
        assert!(!other.debts.has_changed().unwrap());
        assert!(!newcomer.debts.has_changed().unwrap());
        // The largest holder itself gets no more.
        assert_eq!(hog.take(ONE), Err(Bound::Process));
        // Giving a bucket back pays the debt.
        hog.release(ONE);
        assert_eq!(hog.owed(), 0);
        // Within the headroom only: an eighth of the bound.
        newcomer.take(ONE).unwrap();
        newcomer.take(ONE).unwrap();
        assert_eq!(newcomer.take(ONE), Err(Bound::Process));
    }

    #[test]
    fn a_debt_ends_once_the_process_is_within_its_bound() {
        let bounds = Arc::new(BucketBounds::with_bytes(100, [20_000, 20_000, 10_000]));
        let mut hog = Holding::new(Arc::clone(&bounds), Some(ConnectionLoad::default().id()));
        let mut other = Holding::new(Arc::clone(&bounds), Some(ConnectionLoad::default().id()));
        for _ in 0..6 {
            hog.take(ONE).unwrap();
        }
        for _ in 0..4 {
            other.take(ONE).unwrap();
        }
        // Full (10,000). Newcomers on connections of their own take the headroom (1,250):
        // one bucket, owed by the largest holder.
        let mut newcomers: Vec<Holding> = (0..3)
            .map(|_| Holding::new(Arc::clone(&bounds), Some(ConnectionLoad::default().id())))
            .collect();
        assert_eq!(newcomers[0].take(ONE), Ok(()));
        assert_eq!(newcomers[1].take(ONE), Err(Bound::Process));
        assert_eq!((hog.owed(), other.owed()), (1000, 0));
        // The hog gives a bucket back: within the bound again, nobody owes anything.
        hog.release(ONE);
        assert_eq!(hog.owed(), 0);
    }
}
