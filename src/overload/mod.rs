//! Overload: a call that cannot be answered before its caller gives up is answered
//! at once (by the failure mode) instead of queued, so that in a spike the service keeps
//! doing useful work rather than answering every call after its deadline.
//!
//! Three checks run when a call reaches the handler, before it is decoded into a request:
//! 1. **Deadline.** Before the handler runs, a call waits in the runtime's run queue (its
//!    sojourn, from when the connection took the stream). Before that it waited in the
//!    socket's receive buffer, for the connection task behind the same queue: on TCP the
//!    kernel's receive stamp says how long ([`ReceiveStamp`]), and the caller's
//!    deadline counts from then; elsewhere that wait is taken to be about the sojourn. Its
//!    answer takes about as long again on the way out, unless its way in was over twice the
//!    recent average (a passing stall, over by then), when the average stands for it
//!    (`standing`). A call whose `grpc-timeout` leaves less than that cannot be answered in
//!    time, so it is answered now. Only calls that cannot make their deadline are shed this
//!    way.
//! 2. **Queue (CoDel).** For calls without a deadline: once the sojourn has stayed above the
//!    target for a whole interval, calls that waited longer than the target are shed until
//!    it drops below again. A short burst is absorbed, a standing queue is not.
//! 3. **Fair share.** Calls in flight are counted in descriptors (a 64-descriptor request
//!    weighs 64). Past `MAX_IN_FLIGHT` of them, a call is admitted only if its connection
//!    has less than its fair share (the cap over the connections with calls in flight), up
//!    to twice the cap in all: one caller sending 64-descriptor requests cannot take the
//!    service from the others, and memory held by calls in flight stays bounded.
//!
//! Where the wait is a backend's queue rather than the CPU (the Redis batcher), the backend
//! refuses at once a request its queue cannot serve in time (`BackendError::Overloaded`),
//! by the same rule ([`Deadline::leaves_room`]).
//!
//! The parts: [`Deadline`] (a caller's deadline and all arithmetic on it), the arrival of a
//! call ([`Arrival`], stamped by the [`Stamped`] layer, with the kernel's [`ReceiveStamp`]),
//! [`Admission`] (the three checks) and [`ShedReason`] (why a call was shed, for the
//! metrics). This module sits low in the layer map so that the backends and the metrics use
//! these types rather than their own copies.
//!
//! Why deadlines rather than a latency target or an adaptive concurrency limit: only the
//! caller knows when an answer is worthless, and the right concurrency depends on the
//! backend and the machine. A limit cut on latency also shrinks to its floor when the
//! latency comes from a shared, busy CPU, which no concurrency limit can cure.

mod admission;
mod arrival;
mod caller;
mod deadline;
mod shed;
mod standing;

pub use admission::{Admission, DEFAULT_TARGET_LATENCY, MAX_IN_FLIGHT, Permit, QueueWait};
pub use arrival::{Arrival, ConnectionId, ConnectionLoad, ReceiveStamp, Stamped};
pub use caller::Caller;
pub use deadline::{Deadline, ROOM_PER_WAIT, parse_grpc_timeout, work_ends_within};
pub use shed::ShedReason;
