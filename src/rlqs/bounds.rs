//! How many buckets the quota streams may hold: per stream (`--rlqs-max-buckets`), per
//! connection and for the whole process, so that many streams on one connection, or many
//! connections, cannot grow memory without bound. A bucket past a bound is left without an
//! assignment (Envoy applies its `no_assignment_behavior`); its stream stays open.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::overload::ConnectionId;

/// A connection's streams together hold at most this many times `--rlqs-max-buckets`
/// (Envoy opens one stream per domain, so two full domains fit; 40 streams of 10,000
/// buckets on one connection then take under 64 MiB).
pub const CONNECTION_STREAMS: usize = 2;
/// The process holds at most this many times `--rlqs-max-buckets` (200,000 by default,
/// about 150 MiB at the largest ids a stream may hold on average).
pub const PROCESS_STREAMS: usize = 20;

/// Buckets held, per connection and in all.
#[derive(Debug)]
pub struct BucketBounds {
    per_stream: usize,
    per_connection: usize,
    process: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    connections: HashMap<ConnectionId, usize>,
}

/// Which bound a bucket met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `--rlqs-max-buckets` of its stream.
    Stream,
    /// Its connection's share.
    Connection,
    /// The process's.
    Process,
}

impl BucketBounds {
    /// Bounds for `per_stream` buckets a stream.
    pub fn new(per_stream: usize) -> BucketBounds {
        BucketBounds {
            per_stream,
            per_connection: per_stream.saturating_mul(CONNECTION_STREAMS),
            process: per_stream.saturating_mul(PROCESS_STREAMS),
            held: Mutex::new(Held::default()),
        }
    }
}

/// One stream's hold on the bounds; gives its buckets back when dropped.
#[derive(Debug)]
pub struct Holding {
    bounds: Arc<BucketBounds>,
    connection: Option<ConnectionId>,
    held: usize,
}

impl Holding {
    /// A stream holding nothing yet, on `connection` when known.
    pub fn new(bounds: Arc<BucketBounds>, connection: Option<ConnectionId>) -> Holding {
        Holding {
            bounds,
            connection,
            held: 0,
        }
    }

    /// Takes one more bucket, or says which bound it would pass.
    pub fn take(&mut self) -> Result<(), Bound> {
        if self.held >= self.bounds.per_stream {
            return Err(Bound::Stream);
        }
        let mut held = self.bounds.held.lock();
        if held.total >= self.bounds.process {
            return Err(Bound::Process);
        }
        if let Some(connection) = self.connection {
            let on_connection = held.connections.entry(connection).or_default();
            if *on_connection >= self.bounds.per_connection {
                return Err(Bound::Connection);
            }
            *on_connection += 1;
        }
        held.total += 1;
        self.held += 1;
        Ok(())
    }

    /// Gives one bucket back.
    pub fn release(&mut self) {
        self.release_many(1);
    }

    fn release_many(&mut self, count: usize) {
        let count = count.min(self.held);
        if count == 0 {
            return;
        }
        self.held -= count;
        let mut held = self.bounds.held.lock();
        held.total -= count;
        if let Some(connection) = self.connection
            && let Some(on_connection) = held.connections.get_mut(&connection)
        {
            *on_connection -= count;
            if *on_connection == 0 {
                held.connections.remove(&connection);
            }
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.release_many(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overload::ConnectionLoad;

    #[test]
    fn streams_connections_and_the_process_are_bounded_and_give_back_on_drop() {
        let bounds = Arc::new(BucketBounds::new(2));
        let one = ConnectionLoad::default().id();
        let mut streams: Vec<Holding> = (0..CONNECTION_STREAMS + 1)
            .map(|_| Holding::new(Arc::clone(&bounds), Some(one)))
            .collect();
        for stream in &mut streams[..CONNECTION_STREAMS] {
            assert_eq!(stream.take(), Ok(()));
            assert_eq!(stream.take(), Ok(()));
            assert_eq!(stream.take(), Err(Bound::Stream));
        }
        assert_eq!(streams[CONNECTION_STREAMS].take(), Err(Bound::Connection));
        streams[0].release();
        assert_eq!(streams[CONNECTION_STREAMS].take(), Ok(()));
        streams.clear();
        assert_eq!(bounds.held.lock().total, 0);
        assert!(bounds.held.lock().connections.is_empty());
        // The process bound: streams on connections of their own.
        let mut many: Vec<Holding> = (0..PROCESS_STREAMS + 1)
            .map(|_| Holding::new(Arc::clone(&bounds), None))
            .collect();
        for stream in &mut many[..PROCESS_STREAMS] {
            assert_eq!(stream.take(), Ok(()));
            assert_eq!(stream.take(), Ok(()));
        }
        assert_eq!(many[PROCESS_STREAMS].take(), Err(Bound::Process));
    }
}
