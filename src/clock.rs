//! Wall time in ms since the Unix epoch, injected wherever a decision reads it: the memory
//! backend, the limiter (for `L = 0` answers) and the pinned test scripts. Windows align to
//! the epoch as they do under Redis `TIME`. Tests hand in a [`ManualClock`] instead of
//! sleeping; `clippy.toml` allows the wall clock to be read only here.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of time in ms since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time; may go backwards (the algorithms tolerate it).
    fn now_ms(&self) -> i64;
}

/// The wall clock, as Redis `TIME` would give it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the one reader of the wall clock; everything else is handed a Clock"
    )]
    fn now_ms(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// A clock that only moves when told to: windows and expiry in tests without sleeping.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock(AtomicI64::new(now_ms))
    }

    /// Sets the time (backwards too).
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time by `delta_ms` (negative goes backwards).
    pub fn advance(&self, delta_ms: i64) {
        self.0.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
