//! What ambient authority reaches the guest. By default nothing does: no files, no network, no
//! environment variables, no arguments, stdio discarded, a wall clock frozen at a fixed instant
//! and randomness from a fixed seed, so a script's behaviour (and its fuel) is reproducible.
//! Each grant here opens one door explicitly.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder};

/// Explicit grants of ambient authority to a session's guest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Grants {
    /// What `Date.now()` and `new Date()` see.
    pub clock: ClockGrant,
    /// Where `Math.random()` and the guest's WASI randomness come from.
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
    /// The host's real wall clock and monotonic clock.
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
    /// The seed for the guest's `Math.random`.
    pub(crate) fn random_seed(&self) -> u64 {
        match self.entropy {
            EntropyGrant::Seeded { seed } => seed,
            EntropyGrant::Host => {
                let mut bytes = [0u8; 8];
                wasmtime_wasi::Rng::fill_bytes(&mut *wasmtime_wasi::thread_rng(), &mut bytes);
                u64::from_le_bytes(bytes)
            }
        }
    }

    /// A WASI context granting exactly what these grants say and nothing else.
    pub(crate) fn wasi_context(&self, mut builder: WasiCtxBuilder) -> WasiCtx {
        if let ClockGrant::Frozen { unix_ms } = self.clock {
            builder
                .wall_clock(FrozenClock(Duration::from_millis(unix_ms)))
                .monotonic_clock(FrozenClock(Duration::ZERO));
        }
        if let EntropyGrant::Seeded { seed } = self.entropy {
            let bytes: Vec<u8> = (0..4u64)
                .flat_map(|i| splitmix(seed.wrapping_add(i)).to_le_bytes())
                .collect();
            builder
                .secure_random(wasmtime_wasi::Deterministic::new(bytes.clone()))
                .insecure_random(wasmtime_wasi::Deterministic::new(bytes))
                .insecure_random_seed(u128::from(seed));
        }
        builder.build()
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A clock that never moves.
struct FrozenClock(Duration);

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        self.0
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }
}
