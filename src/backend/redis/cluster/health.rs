//! Whether a master may be given decisions after it went silent.
//!
//! A master that stops answering (frozen by SIGSTOP, a stalled VM, cut off) can be failed
//! over while it sleeps. When it wakes, Redis serves the commands already in its input
//! buffers before it reads, on the cluster bus, that it lost its slots (milliseconds later):
//! a decision sent just before it woke is answered OK, and its bookings vanish when the old
//! master resynchronises from the promoted replica. Measured in the soak: 16 decisions over
//! their limits after a 5 s freeze with a 2 s node timeout.
//!
//! So a master silent for [`SILENT_FOR`] is quarantined: it gets no decision (the failure
//! mode answers at once) while a `PING` probes it, and decisions resume [`GRACE`] after it
//! answers one, by when a master that was replaced knows it and refuses them (`READONLY`,
//! `MOVED`). A decision sent before the quarantine began is older than its deadline when the
//! master wakes, so its caller already had its answer.
//!
//! The replica that takes over gets its own batcher and health (`super::refresh`): its calls
//! and probes go to its own address, never to the frozen node, so it is served as soon as
//! floodgate reads the new slot map.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Silence after which a master is quarantined: several backend timeouts, and well under
/// any sensible `cluster-node-timeout` (Redis' default is 15 s), so that the quarantine
/// starts before a failover can complete.
pub(super) const SILENT_FOR: Duration = Duration::from_millis(500);
/// How long after a quarantined master answers a probe it gets decisions again.
pub(super) const GRACE: Duration = Duration::from_millis(250);

/// One master's recent answers (see the module doc).
#[derive(Debug)]
pub(super) struct Health {
    origin: Instant,
    /// When the master last answered anything, in ms after `origin`.
    answered_ms: AtomicU64,
    quarantined: AtomicBool,
    /// When a quarantined master answered a probe, in ms after `origin`; 0: not yet.
    probe_answered_ms: AtomicU64,
    /// Set while a probe is out.
    probing: AtomicBool,
}

impl Health {
    /// A master that answered just now.
    pub(super) fn new() -> Health {
        let health = Health {
            origin: Instant::now(),
            answered_ms: AtomicU64::new(0),
            quarantined: AtomicBool::new(false),
            probe_answered_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        };
        health.answered(Instant::now());
        health
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// The master answered (a reply or an error reply: it is running).
    pub(super) fn answered(&self, at: Instant) {
        self.answered_ms.store(self.ms(at), Ordering::Relaxed);
    }

    /// A call got no answer (timeout, or no connection): past `SILENT_FOR` of silence the
    /// master is quarantined.
    pub(super) fn unanswered(&self, at: Instant) {
        let silent = self
            .ms(at)
            .saturating_sub(self.answered_ms.load(Ordering::Relaxed));
        if silent >= SILENT_FOR.as_millis() as u64 {
            self.probe_answered_ms.store(0, Ordering::Relaxed);
            self.quarantined.store(true, Ordering::Release);
        }
    }

    /// Whether a decision may go to the master at `at`; lifts the quarantine once `GRACE`
    /// has passed since a probe was answered.
    pub(super) fn admits(&self, at: Instant) -> bool {
        if !self.quarantined.load(Ordering::Acquire) {
            return true;
        }
        let answered = self.probe_answered_ms.load(Ordering::Relaxed);
        if answered == 0 || self.ms(at) < answered.saturating_add(GRACE.as_millis() as u64) {
            return false;
        }
        self.answered(at);
        self.quarantined.store(false, Ordering::Release);
        true
    }

    /// Claims the one probe that may be out; `false` when one already is.
    pub(super) fn start_probe(&self) -> bool {
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// The probe ended; `answered_at` when the master answered it.
    pub(super) fn end_probe(&self, answered_at: Option<Instant>) {
        if let Some(at) = answered_at
            && self.probe_answered_ms.load(Ordering::Relaxed) == 0
        {
            self.probe_answered_ms.store(self.ms(at), Ordering::Relaxed);
        }
        self.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_master_gets_decisions_again_only_a_grace_after_it_answers() {
        let health = Health::new();
        // Timeouts shortly after an answer: a slow call, not a silent master.
        tokio::time::advance(Duration::from_millis(100)).await;
        health.unanswered(Instant::now());
        assert!(health.admits(Instant::now()));
        tokio::time::advance(SILENT_FOR).await;
        health.unanswered(Instant::now());
        assert!(!health.admits(Instant::now()), "silent past SILENT_FOR");
        // A probe that fails changes nothing; one probe at a time.
        assert!(health.start_probe());
        assert!(!health.start_probe());
        health.end_probe(None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!health.admits(Instant::now()), "no probe answered yet");
        // Answered: still refused until the grace has passed, then admitted for good.
        assert!(health.start_probe());
        health.end_probe(Some(Instant::now()));
        tokio::time::advance(GRACE / 2).await;
        assert!(!health.admits(Instant::now()));
        tokio::time::advance(GRACE).await;
        assert!(health.admits(Instant::now()));
        health.unanswered(Instant::now());
        assert!(health.admits(Instant::now()), "it answered just now");
    }
}
