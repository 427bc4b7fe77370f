//! The token table requests are authenticated against, replaceable while the server runs:
//! `corral serve` reloads it from its configuration file on SIGHUP.
//!
//! The table is swapped atomically ([`arc_swap`]): a request authenticates against either the
//! old table or the new one, never a mix, and nothing waits on a lock. A file that does not
//! validate changes nothing ([`TokenReloader::reload`] is only given a validated
//! [`Config`]); the caller logs why.

use std::sync::Arc;

use arc_swap::ArcSwap;
use subtle::ConstantTimeEq;

use crate::config::{Config, TokenConfig};
use crate::runtime::Runtime;

/// The current credentials.
#[derive(Debug)]
pub struct TokenTable(ArcSwap<Vec<TokenConfig>>);

impl TokenTable {
    /// A table of `tokens` (validated by [`Config`]).
    pub fn new(tokens: Vec<TokenConfig>) -> TokenTable {
        TokenTable(ArcSwap::from_pointee(tokens))
    }

    /// The credential `presented` matches, comparing it with every token in constant time.
    pub fn authenticate(&self, presented: &str) -> Option<TokenConfig> {
        let tokens = self.0.load();
        let mut found = None;
        for token in tokens.iter() {
            if bool::from(token.token.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(token);
            }
        }
        found.cloned()
    }

    /// Replaces every token at once.
    pub fn replace(&self, tokens: Vec<TokenConfig>) {
        self.0.store(Arc::new(tokens));
    }

    /// How many tokens the table holds.
    pub fn len(&self) -> usize {
        self.0.load().len()
    }

    /// Whether the table is empty (a validated configuration never is).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reloads a running server's tokens (taken from [`crate::Server::token_reloader`] before
/// [`crate::Server::run`]).
#[derive(Debug, Clone)]
pub struct TokenReloader(pub(crate) Arc<Runtime>);

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// Tokens now in force.
    pub tokens: usize,
    /// Settings that differ from the running ones and take effect only on a restart.
    pub needs_restart: Vec<&'static str>,
}

impl TokenReloader {
    /// Puts `config`'s tokens in force; reports the other settings it changed, which are not
    /// applied until a restart.
    pub fn reload(&self, config: &Config) -> Reloaded {
        let running = self.0.config();
        let mut needs_restart = Vec::new();
        if config.listen != running.listen {
            needs_restart.push("listen");
        }
        if config.store != running.store {
            needs_restart.push("store");
        }
        if config.lease != running.lease {
            needs_restart.push("leaseMs");
        }
        if config.limits != running.limits {
            needs_restart.push("limits");
        }
        if config.retention != running.retention {
            needs_restart.push("retention");
        }
        if config.models != running.models {
            needs_restart.push("models");
        }
        self.0.tokens.replace(config.tokens.clone());
        Reloaded {
            tokens: self.0.tokens.len(),
            needs_restart,
        }
    }
}
