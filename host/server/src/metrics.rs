//! Prometheus text metrics from atomic counters (no registry needed for this fixed set).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

const COMMANDS: &[&str] = &[
    "message",
    "approve",
    "respond",
    "cancel",
    "action_result",
    "resolve",
];
const OUTCOMES: &[&str] = &[
    "completed",
    "paused",
    "waiting",
    "uncertain",
    "failed",
    "cancelled",
    "aborted",
];
const EFFECTS: &[&str] = &["completed", "uncertain", "cancelled", "pending"];
/// Background store operations whose failures are counted (each is also logged).
const STORE_OPERATIONS: &[&str] = &[
    "start_segment",
    "finish_segment",
    "expire_action_claims",
    "apply_retention",
    "count_sessions",
];
/// What retention removed.
const PRUNED: &[&str] = &[
    "closed",
    "sessions",
    "events",
    "items",
    "checkpoints",
    "commands",
];
/// Upper bounds of the store latency histogram, in seconds.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Accepted commands, by tenant and type.
    commands: Labelled,
    command_rejections: AtomicU64,
    /// Ended turn segments, by tenant, agent and outcome.
    turns: Labelled,
    effects: [AtomicU64; 4],
    lease_expiries: AtomicU64,
    sse_streams: AtomicI64,
    sse_dropped: AtomicU64,
    store_buckets: [AtomicU64; 10],
    store_count: AtomicU64,
    store_micros: AtomicU64,
    store_errors: [AtomicU64; 5],
    pruned: [AtomicU64; 6],
    retention_passes: AtomicU64,
    connections: AtomicI64,
    connections_refused: AtomicU64,
    connections_timed_out: [AtomicU64; 2],
    /// Requests refused by a per-client limit, by limit and tenant.
    rate_limited: Labelled,
}

/// Why the watchdog closed connections (see [`crate::limits`]).
const CONNECTION_TIMEOUTS: &[&str] = &["header_read", "idle"];

/// A counter family with free label values (tenants, agents), kept in order for rendering.
#[derive(Debug, Default)]
pub(crate) struct Labelled(std::sync::Mutex<std::collections::BTreeMap<Vec<String>, u64>>);

impl Labelled {
    fn add(&self, labels: &[&str], by: u64) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *map.entry(labels.iter().map(|l| (*l).to_owned()).collect())
            .or_insert(0) += by;
    }

    /// Writes `name{k1="v1",...} n` for every label set.
    fn render(&self, out: &mut String, name: &str, keys: &[&str]) {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (values, count) in map.iter() {
            let labels: Vec<String> = keys
                .iter()
                .zip(values)
                .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {count}", labels.join(","));
        }
    }
}

/// A label value as the Prometheus text format writes it.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn bump(names: &[&str], counters: &[AtomicU64], name: &str, by: u64) {
    if let Some(index) = names.iter().position(|n| *n == name) {
        counters[index].fetch_add(by, Ordering::Relaxed);
    }
}

impl Metrics {
    /// An accepted command of `kind` on a session of `tenant`.
    pub fn command(&self, tenant: &str, kind: &str) {
        if COMMANDS.contains(&kind) {
            self.commands.add(&[tenant, kind], 1);
        }
    }
    /// A refused command.
    pub fn command_rejected(&self) {
        self.command_rejections.fetch_add(1, Ordering::Relaxed);
    }
    /// A turn segment of `agent` on a session of `tenant` ended with `outcome`.
    pub fn turn(&self, tenant: &str, agent: &str, outcome: &str) {
        if OUTCOMES.contains(&outcome) {
            self.turns.add(&[tenant, agent, outcome], 1);
        }
    }
    /// `count` effects moved to `status`.
    pub fn effects(&self, status: &str, count: usize) {
        bump(EFFECTS, &self.effects, status, count as u64);
    }
    /// Executor claims that expired.
    pub fn lease_expiries(&self, count: usize) {
        self.lease_expiries
            .fetch_add(count as u64, Ordering::Relaxed);
    }
    /// An SSE stream opened (`+1`) or closed (`-1`).
    pub fn sse_stream(&self, delta: i64) {
        self.sse_streams.fetch_add(delta, Ordering::Relaxed);
    }
    /// A slow SSE client was dropped.
    pub fn sse_dropped(&self) {
        self.sse_dropped.fetch_add(1, Ordering::Relaxed);
    }
    /// A background store operation failed (logged where it happened).
    pub fn store_error(&self, operation: &str) {
        bump(STORE_OPERATIONS, &self.store_errors, operation, 1);
    }
    /// One retention pass removed `report`'s rows.
    pub fn retention(&self, report: &corral_store::RetentionReport) {
        self.retention_passes.fetch_add(1, Ordering::Relaxed);
        for (name, count) in [
            ("closed", report.sessions_closed),
            ("sessions", report.sessions_deleted),
            ("events", report.events_pruned),
            ("items", report.items_pruned),
            ("checkpoints", report.checkpoints_pruned),
            ("commands", report.commands_pruned),
        ] {
            bump(PRUNED, &self.pruned, name, count);
        }
    }
    /// A connection opened (`+1`) or closed (`-1`).
    pub fn connection(&self, delta: i64) {
        self.connections.fetch_add(delta, Ordering::Relaxed);
    }
    /// A connection over `maxConnections` was answered 503 and closed.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }
    /// The watchdog closed a connection (`header_read` or `idle`).
    pub fn connection_timed_out(&self, reason: &str) {
        bump(CONNECTION_TIMEOUTS, &self.connections_timed_out, reason, 1);
    }
    /// A request was refused by a per-client limit (`commands` or `sse_streams`).
    pub fn rate_limited(&self, limit: &str, tenant: &str) {
        self.rate_limited.add(&[limit, tenant], 1);
    }
    /// Open connections.
    pub fn open_connections(&self) -> i64 {
        self.connections.load(Ordering::Relaxed)
    }
    /// Open SSE streams.
    pub fn open_streams(&self) -> i64 {
        self.sse_streams.load(Ordering::Relaxed)
    }
    /// Slow clients dropped so far.
    pub fn dropped_streams(&self) -> u64 {
        self.sse_dropped.load(Ordering::Relaxed)
    }
    /// One store call took `elapsed`.
    pub fn store_call(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        for (index, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.store_buckets[index].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.store_count.fetch_add(1, Ordering::Relaxed);
        self.store_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The Prometheus text exposition, without the session gauges (see [`scrape`]).
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// The Prometheus text exposition; with `sessions`, the `corral_sessions` gauges.
    pub fn render_with(&self, sessions: Option<&[corral_store::SessionCount]>) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            &mut out,
            "corral_commands_total",
            "counter",
            "Commands accepted, by tenant and type.",
        );
        self.commands
            .render(&mut out, "corral_commands_total", &["tenant", "type"]);
        family(
            &mut out,
            "corral_command_rejections_total",
            "counter",
            "Commands refused.",
        );
        let _ = writeln!(
            out,
            "corral_command_rejections_total {}",
            load(&self.command_rejections)
        );
        family(
            &mut out,
            "corral_turns_total",
            "counter",
            "Turn segments ended, by tenant, agent and outcome.",
        );
        self.turns.render(
            &mut out,
            "corral_turns_total",
            &["tenant", "agent", "outcome"],
        );
        if let Some(sessions) = sessions {
            family(
                &mut out,
                "corral_sessions",
                "gauge",
                "Sessions that wait on someone (paused, waiting, uncertain), by tenant, agent and \
                 status, counted in the store at each scrape.",
            );
            for count in sessions {
                let _ = writeln!(
                    out,
                    "corral_sessions{{tenant=\"{}\",agent=\"{}\",status=\"{}\"}} {}",
                    escape(&count.tenant_id),
                    escape(&count.agent_id),
                    count.status.as_str(),
                    count.sessions
                );
            }
        }
        family(
            &mut out,
            "corral_effects_total",
            "counter",
            "Effect transitions made by the server, by new status.",
        );
        for (name, counter) in EFFECTS.iter().zip(&self.effects) {
            let _ = writeln!(
                out,
                "corral_effects_total{{status=\"{name}\"}} {}",
                load(counter)
            );
        }
        family(
            &mut out,
            "corral_uncertain_total",
            "counter",
            "Effects that became uncertain.",
        );
        let _ = writeln!(out, "corral_uncertain_total {}", load(&self.effects[1]));
        family(
            &mut out,
            "corral_lease_expiries_total",
            "counter",
            "Executor claims that expired.",
        );
        let _ = writeln!(
            out,
            "corral_lease_expiries_total {}",
            load(&self.lease_expiries)
        );
        family(&mut out, "corral_sse_streams", "gauge", "Open SSE streams.");
        let _ = writeln!(
            out,
            "corral_sse_streams {}",
            self.sse_streams.load(Ordering::Relaxed)
        );
        family(
            &mut out,
            "corral_sse_dropped_total",
            "counter",
            "Slow SSE clients dropped.",
        );
        let _ = writeln!(out, "corral_sse_dropped_total {}", load(&self.sse_dropped));
        family(
            &mut out,
            "corral_store_latency_seconds",
            "histogram",
            "Latency of store calls made by the server.",
        );
        for (bound, counter) in BUCKETS.iter().zip(&self.store_buckets) {
            let _ = writeln!(
                out,
                "corral_store_latency_seconds_bucket{{le=\"{bound}\"}} {}",
                load(counter)
            );
        }
        let count = load(&self.store_count);
        let _ = writeln!(
            out,
            "corral_store_latency_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "corral_store_latency_seconds_sum {}",
            load(&self.store_micros) as f64 / 1e6
        );
        let _ = writeln!(out, "corral_store_latency_seconds_count {count}");
        family(
            &mut out,
            "corral_store_errors_total",
            "counter",
            "Background store operations that failed, by operation.",
        );
        for (name, counter) in STORE_OPERATIONS.iter().zip(&self.store_errors) {
            let _ = writeln!(
                out,
                "corral_store_errors_total{{operation=\"{name}\"}} {}",
                load(counter)
            );
        }
        family(
            &mut out,
            "corral_retention_passes_total",
            "counter",
            "Retention passes run.",
        );
        let _ = writeln!(
            out,
            "corral_retention_passes_total {}",
            load(&self.retention_passes)
        );
        family(
            &mut out,
            "corral_retention_pruned_total",
            "counter",
            "Sessions closed (`closed`) and rows removed by retention, by kind.",
        );
        for (name, counter) in PRUNED.iter().zip(&self.pruned) {
            let _ = writeln!(
                out,
                "corral_retention_pruned_total{{kind=\"{name}\"}} {}",
                load(counter)
            );
        }
        family(&mut out, "corral_connections", "gauge", "Open connections.");
        let _ = writeln!(
            out,
            "corral_connections {}",
            self.connections.load(Ordering::Relaxed)
        );
        family(
            &mut out,
            "corral_connections_refused_total",
            "counter",
            "Connections over maxConnections, answered 503 and closed.",
        );
        let _ = writeln!(
            out,
            "corral_connections_refused_total {}",
            load(&self.connections_refused)
        );
        family(
            &mut out,
            "corral_connections_timed_out_total",
            "counter",
            "Connections closed for a slow request head (header_read) or idleness (idle).",
        );
        for (name, counter) in CONNECTION_TIMEOUTS.iter().zip(&self.connections_timed_out) {
            let _ = writeln!(
                out,
                "corral_connections_timed_out_total{{reason=\"{name}\"}} {}",
                load(counter)
            );
        }
        family(
            &mut out,
            "corral_rate_limited_total",
            "counter",
            "Requests refused with 429, by limit (commands, sse_streams) and tenant.",
        );
        self.rate_limited
            .render(&mut out, "corral_rate_limited_total", &["limit", "tenant"]);
        family(
            &mut out,
            "corral_trace_spans_dropped_total",
            "counter",
            "Trace spans dropped: the export queue was full or the collector failed (docs/tracing.md).",
        );
        let _ = writeln!(
            out,
            "corral_trace_spans_dropped_total {}",
            corral_telemetry::spans_dropped()
        );
        out
    }
}

/// The statuses `corral_sessions` counts: sessions waiting on a person or a system.
pub const GAUGED_STATUSES: &[corral_store::SessionStatus] = &[
    corral_store::SessionStatus::Paused,
    corral_store::SessionStatus::Waiting,
    corral_store::SessionStatus::Uncertain,
];

/// `/metrics`: the counters, and the session gauges counted in the store now (one grouped
/// query; when it fails the gauges are left out and `count_sessions` errors counted).
pub(crate) async fn scrape(runtime: &crate::runtime::Runtime) -> String {
    let mut out = match runtime
        .timed(runtime.store.count_sessions(GAUGED_STATUSES))
        .await
    {
        Ok(counts) => runtime.metrics.render_with(Some(&counts)),
        Err(error) => {
            tracing::warn!(%error, "counting sessions for /metrics failed");
            runtime.metrics.store_error("count_sessions");
            runtime.metrics.render()
        }
    };
    // Kept by the store itself: every transaction of this process, the scrape's count included.
    let _ = writeln!(
        out,
        "# HELP corral_store_transactions_total Store transactions this process ran, reads and \
         writes.\n# TYPE corral_store_transactions_total counter\n\
         corral_store_transactions_total {}",
        runtime.store.transactions()
    );
    out
}
