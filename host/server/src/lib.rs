//! `corral serve`: the durable runtime server over HTTP (SPEC S4; the wire contract is pinned in
//! the server issue). Agents, sessions, idempotent commands, an effects journal with external
//! executors, per-session event streams (SSE) and the turn scheduler, over [`corral_store`].
//!
//! ```no_run
//! # async fn demo(config: corral_server::Config, store: std::sync::Arc<dyn corral_store::Store>)
//! # -> std::io::Result<()> {
//! use std::sync::Arc;
//! use corral_server::{Server, script::ScriptRunner};
//!
//! let listener = tokio::net::TcpListener::bind(config.listen).await?;
//! let server = Server::new(config, store, Arc::new(ScriptRunner::default()));
//! server.run(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! # Shape
//!
//! - [`routes`]: the route table and thin handlers; [`error`]: the one error type and the one
//!   function that turns it into the JSON envelope; [`auth`]: bearer tokens.
//! - [`runtime`]: commands and their status rules, each one store commit guarded by the
//!   session's version and carrying its idempotency record.
//! - [`scheduler`]-side tasks (turn scheduler, lease sweeper) and [`sse`] (fan-out and streams)
//!   are named tasks stopped by one shutdown signal; [`Server::run`] is the one place that
//!   starts and stops them.
//! - [`console`]: the operator console, a small embedded single-page app at `/console` that
//!   uses only the public API.
//! - [`runner`]: the seam to the turn engine (the chat runtime); [`script::ScriptRunner`] is a
//!   small scripted engine for tests and for `corral serve` until the chat runtime lands.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod auth;
pub mod chat_runner;
pub mod config;
pub mod console;
pub mod error;
pub mod limits;
pub mod logging;
pub mod manifest;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod runner;
pub mod runtime;
mod scheduler;
pub mod script;
pub mod sse;
pub mod tenancy;
pub mod tokens;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_store::Store;
use tracing::Instrument as _;

pub use chat_runner::ChatTurnRunner;
pub use config::{Config, ConfigError, Role, StoreLocation, TokenConfig};
pub use error::ApiError;
pub use runner::{
    Decision, Finished, Interaction, TurnCheckpoint, TurnJob, TurnOutcome, TurnRunner,
};

use crate::metrics::Metrics;
use crate::runtime::Runtime;
use crate::sse::Hub;

/// How long shutdown waits for running turn segments to finish their last writes.
const DRAIN: Duration = Duration::from_secs(10);

/// A configured server, not yet listening.
#[derive(Debug)]
pub struct Server {
    runtime: Arc<Runtime>,
    hub: Arc<Hub>,
}

impl Server {
    /// A server over `store`, running turns with `runner`.
    pub fn new(config: Config, store: Arc<dyn Store>, runner: Arc<dyn TurnRunner>) -> Server {
        let metrics = Arc::new(Metrics::default());
        let runtime = Arc::new(Runtime::new(config, store, runner, metrics));
        Server {
            runtime,
            hub: Arc::new(Hub::default()),
        }
    }

    /// The store the server uses.
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.runtime.store)
    }

    /// A handle that replaces the running server's tokens (SIGHUP in `corral serve`).
    pub fn token_reloader(&self) -> tokens::TokenReloader {
        tokens::TokenReloader(Arc::clone(&self.runtime))
    }

    /// This process's replica id.
    pub fn replica_id(&self) -> &str {
        self.runtime.replica_id()
    }

    /// Serves on `listener` until `shutdown` resolves, then shuts down gracefully: `/ready`
    /// answers 503, no new connection, command or segment is accepted, the streams end, and
    /// running turn segments get the configuration's `shutdownGraceMs` to finish what they are
    /// doing (a webhook call answering, a segment reaching its pause or end) before they are
    /// aborted, at which point what is still in flight is recorded `uncertain`; then their last
    /// journal writes drain and the store is released.
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let Server { runtime, hub } = self;
        let reason =
            "the process running the turn stopped before the effect's outcome was recorded";
        // The embedded store has one owner at a time (an exclusive lock on its file), so every
        // lease in it belongs to a dead process; a PostgreSQL replica with a stable name
        // (`replicaName`) knows the leases under its name are its previous incarnation's. Both
        // take those over now instead of waiting for them to expire, marking what was in
        // flight uncertain.
        let recovered = if runtime.store.backend() == corral_store::StoreBackend::Sqlite {
            Some(runtime.store.recover_in_flight_effects(reason, true).await)
        } else if runtime.config().replica_name.is_some() {
            Some(
                runtime
                    .store
                    .recover_replica_leases(reason, runtime.replica_id())
                    .await,
            )
        } else {
            None
        };
        if let Some(recovered) = recovered {
            match recovered {
                Ok(changed) => runtime.metrics.effects("uncertain", changed),
                Err(error) => {
                    runtime.metrics.store_error("start_segment");
                    tracing::warn!(%error, "taking over a dead process's leases failed");
                }
            }
        }
        let tasks = tokio_util::task::TaskTracker::new();
        tasks.spawn(
            scheduler::scheduler(Arc::clone(&runtime)).instrument(tracing::info_span!("scheduler")),
        );
        tasks.spawn(
            scheduler::sweeper(Arc::clone(&runtime))
                .instrument(tracing::info_span!("lease-sweeper")),
        );
        tasks.spawn(
            scheduler::retention(Arc::clone(&runtime)).instrument(tracing::info_span!("retention")),
        );
        tasks.spawn(
            sse::fan_out(Arc::clone(&runtime), Arc::clone(&hub))
                .instrument(tracing::info_span!("sse-fan-out")),
        );
        let signal = {
            let runtime = Arc::clone(&runtime);
            async move {
                tokio::select! {
                    () = shutdown => {}
                    () = runtime.shutdown.cancelled() => {}
                }
                runtime.closing.store(true, Ordering::SeqCst);
                runtime.shutdown.cancel();
            }
        };
        let app = routes::router(Arc::clone(&runtime), hub);
        let limits = runtime.config().limits.clone();
        let served =
            limits::serve(listener, app, limits, Arc::clone(&runtime.metrics), signal).await;
        runtime.closing.store(true, Ordering::SeqCst);
        runtime.shutdown.cancel();
        tasks.close();
        runtime.tasks.close();
        let grace = runtime.config().shutdown_grace;
        let finished = tokio::time::timeout(grace, async {
            tasks.wait().await;
            runtime.tasks.wait().await;
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                "turn segments still running after the {grace:?} grace period: aborting them"
            );
        }
        runtime.abort.cancel();
        let drained = tokio::time::timeout(DRAIN, async {
            tasks.wait().await;
            runtime.tasks.wait().await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!("turn segments did not finish within {DRAIN:?}; stopping anyway");
        }
        served
    }
}
