//! What ambient authority reaches the guest. By default nothing does: the component imports
//! nothing but `corral:sandbox/host` (no files, network, environment or stdio exist for it at
//! all), its wall clock is frozen at a fixed instant and its randomness comes from a fixed seed,
//! so a script's behaviour (and its fuel) is reproducible. Each grant here opens one door
//! explicitly, through the session config and `host.now-ms`.

use serde::{Deserialize, Serialize};

use crate::bindings::corral::sandbox::types::Clock;

/// Explicit grants of ambient authority to a session's guest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Grants {
    /// What `Date.now()` and `new Date()` see.
    pub clock: ClockGrant,
    /// Where `Math.random()` and the guest's other randomness come from.
    pub entropy: EntropyGrant,
}

/// The guest's view of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ClockGrant {
    /// Time stands still at this many milliseconds after the Unix epoch (default 0, so
    /// `new Date()` is 1970-01-01T00:00:00Z and no timing side channel exists).
    Frozen {
        /// Milliseconds since the Unix epoch.
        unix_ms: u64,
    },
    /// The host's real wall clock, read through `host.now-ms` whenever the script asks.
    Real,
}

impl Default for ClockGrant {
    fn default() -> Self {
        ClockGrant::Frozen { unix_ms: 0 }
    }
}

/// The guest's source of randomness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EntropyGrant {
    /// A fixed seed: the same script sees the same `Math.random()` sequence every run.
    Seeded {
        /// The seed.
        seed: u64,
    },
    /// Fresh randomness from the host for every session.
    Host,
}

impl Default for EntropyGrant {
    fn default() -> Self {
        EntropyGrant::Seeded { seed: 0 }
    }
}

impl Grants {
    /// The seed for the guest's `Math.random` and its other randomness.
    pub(crate) fn random_seed(&self) -> u64 {
        match self.entropy {
            EntropyGrant::Seeded { seed } => seed,
            // The standard library keys every `RandomState` from the operating system's
            // randomness (and makes each one distinct), which is all a seed for `Math.random`
            // needs; it is not a cryptographic source, and the guest offers none.
            EntropyGrant::Host => {
                use std::hash::BuildHasher as _;
                std::collections::hash_map::RandomState::new()
                    .hash_one(std::time::SystemTime::now())
            }
        }
    }

    /// The clock as the session config gives it to the guest.
    pub(crate) fn guest_clock(&self) -> Clock {
        match self.clock {
            ClockGrant::Frozen { unix_ms } => Clock::Frozen(unix_ms),
            ClockGrant::Real => Clock::Host,
        }
    }

    /// What `host.now-ms` answers: the real time when granted, else the frozen instant (a guest
    /// without the grant never asks, but if it did it would learn nothing).
    pub(crate) fn now_ms(&self) -> u64 {
        match self.clock {
            ClockGrant::Frozen { unix_ms } => unix_ms,
            ClockGrant::Real => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}
