//! Exponential reconnect delays with jitter, as the reference's xDS client waits: the delay
//! doubles from `initial` up to `max`, and each one is spread by `± jitter` of itself so a
//! fleet that lost its control plane does not reconnect in lockstep.

use std::time::Duration;

/// The reconnect schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The longest delay (before jitter).
    pub max: Duration,
    /// Spread of each delay, 0 (none) to 1 (0 to twice the delay).
    pub jitter: f64,
}

impl Default for Backoff {
    /// 1 s doubling to 60 s, spread by half: the reference's cap and spread, with a shorter
    /// first wait (the reference starts at 10 s) so a brief control-plane restart costs little.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            jitter: 0.5,
        }
    }
}

/// Why a reconnect schedule cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackoffError {
    /// The first delay is zero.
    #[error("the initial xDS backoff must be above 0")]
    ZeroInitial,
    /// The longest delay is below the first.
    #[error("the maximum xDS backoff must not be below the initial one")]
    MaxBelowInitial,
    /// The jitter is outside 0..=1.
    #[error("the xDS backoff jitter must be within 0..=1, got {0}")]
    Jitter(f64),
}

impl Backoff {
    /// Checks the schedule makes sense.
    ///
    /// # Errors
    /// A zero initial delay, a max below it, or a jitter outside 0..=1.
    pub fn check(&self) -> Result<(), BackoffError> {
        if self.initial.is_zero() {
            return Err(BackoffError::ZeroInitial);
        }
        if self.max < self.initial {
            return Err(BackoffError::MaxBelowInitial);
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(BackoffError::Jitter(self.jitter));
        }
        Ok(())
    }

    /// A fresh sequence of delays.
    pub fn delays(&self) -> Delays {
        Delays {
            backoff: *self,
            attempt: 0,
        }
    }
}

/// Successive delays of one [`Backoff`].
#[derive(Debug)]
pub struct Delays {
    backoff: Backoff,
    attempt: u32,
}

impl Delays {
    /// The next delay; each call doubles the base until `max`.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 2u32.saturating_pow(self.attempt.min(31));
        let base = self
            .backoff
            .initial
            .saturating_mul(factor)
            .min(self.backoff.max);
        self.attempt = self.attempt.saturating_add(1);
        let spread = self.backoff.jitter * rand::random_range(-1.0..=1.0);
        base.mul_f64((1.0 + spread).max(0.0))
    }

    /// Starts over from `initial` (after a stream worked).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_and_reset() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
            jitter: 0.0,
        };
        let mut delays = backoff.delays();
        let seen: Vec<_> = (0..4).map(|_| delays.next_delay().as_millis()).collect();
        assert_eq!(seen, [100, 200, 350, 350]);
        delays.reset();
        assert_eq!(delays.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_its_spread() {
        let backoff = Backoff {
            initial: Duration::from_millis(1000),
            max: Duration::from_millis(1000),
            jitter: 0.5,
        };
        let mut delays = backoff.delays();
        let seen: Vec<_> = (0..200).map(|_| delays.next_delay()).collect();
        assert!(seen.iter().all(|d| (500..=1500).contains(&d.as_millis())));
        assert!(
            seen.iter().any(|d| *d != seen[0]),
            "jitter varies the delay"
        );
    }

    #[test]
    fn nonsense_is_rejected() {
        let good = Backoff::default();
        assert!(good.check().is_ok());
        for bad in [
            Backoff {
                initial: Duration::ZERO,
                ..good
            },
            Backoff {
                max: Duration::from_millis(1),
                ..good
            },
            Backoff {
                jitter: 1.5,
                ..good
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
