//! Who a piece of backend work is for: the caller's deadline and the connection it came on,
//! carried together from the service (ShouldRateLimit or a quota stream) down to the
//! backend's queue.

use super::{ConnectionId, Deadline};

/// The caller of one decision or quota booking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    /// When the caller gives up, if it said (`grpc-timeout`).
    pub deadline: Option<Deadline>,
    /// The connection it came on, where known.
    pub connection: Option<ConnectionId>,
}
