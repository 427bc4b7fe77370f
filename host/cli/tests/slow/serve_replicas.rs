//! Several machines: three `corral serve` replicas (child processes of the real binary) on one
//! PostgreSQL database, with sessions spread over them (every request goes to a replica chosen
//! at random), while one replica at a time is killed with SIGKILL at random moments (seeded)
//! and started again. The turn engine is the chat runtime, whose scripted model answers with
//! JavaScript that calls webhook tools at once, waits on an executor's action and pauses for
//! approval. Checked against the database and the replicas' logs:
//! - every turn finishes exactly once (one `turn.completed`, `turn.failed` or `turn.cancelled`);
//! - each session runs on one replica at a time: every lease (session, generation) is granted
//!   to one replica, and no two segments that committed their outcome overlapped in time (the
//!   replicas log `segment started` after the claim commits and `segment finishing` before the
//!   outcome commits, at `corral_server::segments=debug`);
//! - no acknowledged command is lost, no event a client saw is lost or changed, and the event
//!   cursors of every session are 1, 2, 3... with no gap;
//! - no completed effect runs twice (the webhook logs each call's id, the journal's effect id,
//!   before it performs it), and none stays `invoking`.
//!
//! `CORRAL_SOAK_SECONDS` sets how long replicas are killed (25 s by default, at most
//! `CORRAL_SOAK_KILLS` kills, 12 by default); `CORRAL_SOAK_SEED` reproduces a run;
//! `scripts/soak --minutes N` runs it for longer.

#![cfg(unix)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corral_server::manifest::manifest_hash;
use corral_server::tenancy::{DEFAULT_TENANT, session_key};
use corral_store::testing::PgServer;
use corral_store::{
    EffectStatus, PostgresConfig, PostgresHost, PostgresOptions, PostgresStore, Store,
};
use serde_json::{Value, json};

use crate::common::{self, Rng, Server, logging_webhook as webhook};

const OPERATOR: &str = "replica-operator-token-01";
const EXECUTOR: &str = "replica-executor-token-01";
const REPLICAS: usize = 3;
const SESSIONS: usize = 6;

/// What the scripted model answers, in turn: a script, then a closing text.
const SCRIPTS: &[&str] = &[
    "const [a, b] = await Promise.all([tools.soak.hit({ n: 1 }), tools.soak.hit({ n: 2, ms: 150 })]);\nreturn a.n + b.n;",
    "const done = await tools.demo.action({ job: 1 });\nconst h = await tools.soak.hit({ n: 3 });\nreturn { done, h };",
    "return await tools.soak.hit({ n: 4, ms: 400 });",
];

fn manifest(webhook: &str) -> Value {
    let replies: Vec<Value> = (0..600)
        .flat_map(|i| {
            let code = SCRIPTS[i % SCRIPTS.len()];
            [
                json!({"toolCalls": [{"name": "run_js", "arguments": {"code": code}}]}),
                json!({"text": "ok"}),
            ]
        })
        .collect();
    json!({
        "id": "soak",
        "model": {"provider": "scripted", "replies": replies},
        "mode": "js",
        "approval": "script",
        "capabilities": [
            {"kind": "webhook", "id": "soak.hit", "webhookUrl": webhook,
             "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}, "ms": {"type": "integer"}}}},
            {"kind": "action", "id": "demo.action", "input_schema": {"type": "object"}}
        ]
    })
}

/// One life of a replica, for the overlap check: its log.
struct Life {
    log: PathBuf,
}

/// One life of a replica: a `corral serve` whose log (debug for the segments) goes to `log`.
fn spawn(config: &Path, log: &Path) -> Server {
    let mut command = common::serve(config);
    command
        .env("CORRAL_LOG", "warn,corral_server::segments=debug")
        .env("NO_COLOR", "1");
    Server::spawn(command, log)
}

#[derive(Default)]
struct Ledger {
    /// (session, idempotency key) -> the response body the client got.
    acked: BTreeMap<(String, String), Value>,
    /// (session, cursor) -> (type, data) of every event a client saw.
    seen: BTreeMap<(String, u64), (String, Value)>,
    /// The newest cursor seen per session.
    cursors: HashMap<String, u64>,
    /// The turns started by acknowledged messages.
    turns: HashSet<String>,
    keys: u64,
}

struct Driver {
    client: reqwest::Client,
}

impl Driver {
    async fn call(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<(u16, String)> {
        let mut request = self
            .client
            .request(method, format!("{base}{path}"))
            .bearer_auth(token)
            .timeout(Duration::from_secs(5));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    async fn json(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<Value> {
        match self.call(base, method, path, token, body).await? {
            (200, text) => serde_json::from_str(&text).ok(),
            _ => None,
        }
    }

    async fn command(
        &self,
        base: &str,
        ledger: &mut Ledger,
        session: &str,
        token: &str,
        mut command: Value,
    ) {
        ledger.keys += 1;
        let key = format!("key-{}", ledger.keys);
        command["idempotencyKey"] = json!(key);
        let path = format!("/v1/sessions/{session}/commands");
        if let Some((200, text)) = self
            .call(base, reqwest::Method::POST, &path, token, Some(command))
            .await
            && let Ok(body) = serde_json::from_str::<Value>(&text)
        {
            if let Some(turn) = body["turnId"].as_str() {
                ledger.turns.insert(turn.to_owned());
            }
            ledger.acked.insert((session.to_owned(), key), body);
        }
    }

    async fn ready(&self, base: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some((200, _)) = self
                .call(base, reqwest::Method::GET, "/ready", OPERATOR, None)
                .await
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("corral serve never became ready");
    }

    /// One round over the sessions, each through a replica picked at random: move each one
    /// on as a client and an executor would. Whether every session has settled.
    async fn round(
        &self,
        bases: &[String],
        ledger: &mut Ledger,
        rng: &mut Rng,
        go_on: bool,
    ) -> bool {
        use reqwest::Method;
        let mut settled = true;
        for index in 0..SESSIONS {
            let base = &bases[rng.below(bases.len() as u64) as usize];
            let session = format!("soak-{index}");
            let Some(view) = self
                .json(
                    base,
                    Method::GET,
                    &format!("/v1/sessions/{session}"),
                    OPERATOR,
                    None,
                )
                .await
            else {
                settled = false;
                continue;
            };
            match view["status"].as_str().unwrap_or("") {
                "idle" | "completed" | "failed" | "cancelled" => {
                    if go_on {
                        let message = json!({"type": "message", "content": "go on"});
                        self.command(base, ledger, &session, OPERATOR, message)
                            .await;
                    }
                }
                "paused" => {
                    settled = false;
                    for wait in view["waits"].as_array().cloned().unwrap_or_default() {
                        let id = wait["interactionId"].clone();
                        let command = if wait["kind"] == "input" {
                            json!({"type": "respond", "interactionId": id, "value": "yes"})
                        } else {
                            json!({"type": "approve", "interactionId": id, "approved": rng.below(4) != 0})
                        };
                        self.command(base, ledger, &session, OPERATOR, command)
                            .await;
                    }
                }
                "waiting" => {
                    settled = false;
                    let actions = self
                        .json(base, Method::GET, "/v1/actions", EXECUTOR, None)
                        .await;
                    for action in actions
                        .and_then(|a| a["actions"].as_array().cloned())
                        .unwrap_or_default()
                    {
                        if action["sessionId"] != session.as_str() {
                            continue;
                        }
                        let id = action["actionId"].as_str().unwrap_or("").to_owned();
                        let claim = self
                            .json(base, Method::POST, &format!("/v1/actions/{id}/claim"), EXECUTOR,
                                Some(json!({"manifestHash": action["manifestHash"], "implementationVersion": "1"})))
                            .await;
                        if let Some(claim) = claim {
                            self.command(base, ledger, &session, EXECUTOR, json!({"type": "action_result",
                                "actionId": id, "claimId": claim["claimId"], "generation": claim["generation"],
                                "outcome": {"value": {"done": id}}})).await;
                        }
                    }
                }
                "uncertain" => {
                    settled = false;
                    let turn = view["activeTurnId"].clone();
                    for effect in view["uncertainEffects"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                    {
                        if effect["turnId"] == turn {
                            self.command(base, ledger, &session, OPERATOR, json!({"type": "resolve",
                                "effectId": effect["effectId"], "outcome": {"value": "settled by hand"}})).await;
                        }
                    }
                }
                _ => {
                    settled = false;
                    if go_on && rng.below(16) == 0 {
                        let cancel = json!({"type": "cancel", "reason": "soak"});
                        self.command(base, ledger, &session, OPERATOR, cancel).await;
                    }
                }
            }
            // Read what is new, as a client would.
            let after = ledger.cursors.get(&session).copied().unwrap_or(0);
            let path = format!("/v1/sessions/{session}/items?cursor={after}&limit=1000");
            if let Some(page) = self.json(base, Method::GET, &path, OPERATOR, None).await {
                for event in page["items"].as_array().cloned().unwrap_or_default() {
                    let cursor = event["cursor"].as_u64().unwrap_or(0);
                    let kind = event["type"].as_str().unwrap_or("").to_owned();
                    ledger
                        .seen
                        .insert((session.clone(), cursor), (kind, event["data"].clone()));
                    ledger.cursors.insert(session.clone(), cursor);
                }
            }
        }
        settled
    }
}

/// One line of a replica's `corral_server::segments` log.
#[derive(Debug)]
struct Mark {
    micros: u64,
    what: &'static str,
    session: String,
    generation: u64,
    replica: String,
}

/// Microseconds since the month began, from a `2026-12-05T18:25:15.123456Z` timestamp (the
/// suite runs for minutes, and replicas share the machine's clock).
fn micros(stamp: &str) -> Option<u64> {
    let (date, time) = stamp.trim_end_matches('Z').split_once('T')?;
    let day: u64 = date.rsplit('-').next()?.parse().ok()?;
    let mut parts = time.split(':');
    let hours: u64 = parts.next()?.parse().ok()?;
    let minutes: u64 = parts.next()?.parse().ok()?;
    let (seconds, fraction) = parts.next()?.split_once('.').unwrap_or((time, "0"));
    let seconds: u64 = seconds.parse().ok()?;
    let fraction = format!("{fraction:0<6}");
    let fraction: u64 = fraction[..6].parse().ok()?;
    Some((((day * 24 + hours) * 60 + minutes) * 60 + seconds) * 1_000_000 + fraction)
}

/// `line` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    Some(line[start..].split_whitespace().next()?.to_owned())
}

fn marks(log: &Path) -> Vec<Mark> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = &strip_ansi(line);
        let what = ["segment started", "segment finishing", "segment finished"]
            .into_iter()
            .find(|what| line.contains(&format!("{what}:")) || line.contains(&format!("{what} ")));
        let (Some(what), Some(stamp)) = (what, line.split_whitespace().next()) else {
            continue;
        };
        let mark = (|| {
            Some(Mark {
                micros: micros(stamp)?,
                what,
                session: field(line, "session")?,
                generation: field(line, "generation")?.parse().ok()?,
                replica: field(line, "replica")?,
            })
        })();
        out.push(
            mark.unwrap_or_else(|| panic!("unreadable segment line in {}: {line}", log.display())),
        );
    }
    out
}

/// One segment as the logs tell it.
#[derive(Debug, Default)]
struct Span {
    replica: String,
    started: u64,
    finishing: Option<u64>,
    finished: bool,
}

/// Every lease is granted to one replica, and segments that committed their outcome never
/// overlapped on one session. Returns (segments, sessions run by more than one replica).
fn check_exclusive(lives: &[Life]) -> (usize, usize) {
    let mut spans: BTreeMap<(String, u64), Span> = BTreeMap::new();
    for life in lives {
        for mark in marks(&life.log) {
            let key = (mark.session.clone(), mark.generation);
            if mark.what == "segment started" {
                let previous = spans.insert(
                    key.clone(),
                    Span {
                        replica: mark.replica.clone(),
                        started: mark.micros,
                        ..Span::default()
                    },
                );
                assert!(
                    previous.is_none(),
                    "lease {key:?} was granted twice: {previous:?} and {}",
                    mark.replica
                );
                continue;
            }
            let span = spans
                .get_mut(&key)
                .unwrap_or_else(|| panic!("{} of lease {key:?} without its start", mark.what));
            assert_eq!(
                span.replica, mark.replica,
                "lease {key:?} ended by another replica"
            );
            if mark.what == "segment finishing" {
                span.finishing = Some(mark.micros);
            } else {
                assert!(!span.finished, "lease {key:?} finished twice");
                span.finished = true;
            }
        }
    }
    let mut by_session: BTreeMap<&str, Vec<(u64, &Span)>> = BTreeMap::new();
    for ((session, generation), span) in &spans {
        by_session
            .entry(session)
            .or_default()
            .push((*generation, span));
    }
    let mut shared = 0;
    for (session, list) in &by_session {
        let replicas: HashSet<&str> = list.iter().map(|(_, s)| s.replica.as_str()).collect();
        shared += usize::from(replicas.len() > 1);
        let committed: Vec<&(u64, &Span)> = list.iter().filter(|(_, s)| s.finished).collect();
        for pair in committed.windows(2) {
            let ((g1, a), (g2, b)) = (pair[0], pair[1]);
            let a_end = a.finishing.unwrap_or(u64::MAX);
            assert!(
                b.started > a_end,
                "{session}: lease {g2} ({}) started at {} before lease {g1} ({}) finished at {a_end}",
                b.replica,
                b.started,
                a.replica
            );
        }
    }
    (spans.len(), shared)
}

/// Checks the store's invariants (every replica is down).
async fn check(config: PostgresConfig, effect_log: &Path, ledger: &Ledger) {
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(PostgresOptions::new(config))
            .await
            .expect("connect to the database"),
    );
    let stored = |session: &str| session_key(DEFAULT_TENANT, session);
    for ((session, key), response) in &ledger.acked {
        let record = store
            .get_command(&stored(session), key)
            .await
            .expect("read command")
            .unwrap_or_else(|| panic!("acknowledged command {session}/{key} was lost"));
        assert_eq!(
            &record.response, response,
            "the record of {session}/{key} differs from its acknowledgement"
        );
    }
    let mut effect_ids = HashSet::new();
    let mut endings: HashMap<String, usize> = HashMap::new();
    for index in 0..SESSIONS {
        let session = format!("soak-{index}");
        for effect in store
            .list_effects(&stored(&session), None)
            .await
            .expect("effects")
        {
            assert_ne!(
                effect.status,
                EffectStatus::Invoking,
                "effect still invoking: {effect:?}"
            );
            effect_ids.insert(effect.effect_id);
        }
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let page = store
                .list_events(&stored(&session), after, 1000)
                .await
                .expect("events");
            if page.is_empty() {
                break;
            }
            after = page.last().map_or(after, |e| e.cursor);
            events.extend(page);
        }
        for (position, event) in events.iter().enumerate() {
            assert_eq!(
                event.cursor,
                position as u64 + 1,
                "cursor gap or duplicate in {session}"
            );
            if matches!(
                event.event_type.as_str(),
                "turn.completed" | "turn.failed" | "turn.cancelled"
            ) && let Some(turn) = &event.turn_id
            {
                *endings.entry(turn.clone()).or_default() += 1;
            }
        }
        for ((_, cursor), (kind, data)) in ledger
            .seen
            .range((session.clone(), 0)..=(session.clone(), u64::MAX))
        {
            let event = events
                .get(*cursor as usize - 1)
                .unwrap_or_else(|| panic!("event {session}#{cursor} a client saw was lost"));
            assert_eq!(
                (&event.event_type, &event.payload),
                (kind, data),
                "event {session}#{cursor} changed"
            );
        }
    }
    for turn in &ledger.turns {
        assert_eq!(
            endings.get(turn).copied().unwrap_or(0),
            1,
            "turn {turn} did not finish exactly once"
        );
    }
    common::assert_each_logged_effect_once(effect_log, &effect_ids);
}

/// A `postgres://` URL for `config` (a TCP host, as the test server has).
fn url(config: &PostgresConfig) -> String {
    let host = match config.get_hosts().first() {
        Some(PostgresHost::Tcp(host)) => host.clone(),
        other => panic!("the test database has no TCP host: {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let database = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{database}")
}

fn write_config(dir: &Path, store: &str, manifest: &Value) -> PathBuf {
    let hash = manifest_hash(manifest);
    let config = format!(
        r#"listen = "127.0.0.1:0"
store = "{store}"
leaseMs = 1000
[[tokens]]
token = "{OPERATOR}"
role = "application"
[[tokens]]
token = "{EXECUTOR}"
role = "executor"
agent = "soak"
manifestHash = "{hash}"
implementationVersion = "1"
"#
    );
    let path = dir.join("serve.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

#[test]
fn three_replicas_one_killed_at_random_lose_nothing_and_never_share_a_turn() {
    let seconds = env_number("CORRAL_SOAK_SECONDS", 25);
    let max_kills = env_number("CORRAL_SOAK_KILLS", 12);
    let seed = env_number(
        "CORRAL_SOAK_SEED",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 | 1),
    );
    eprintln!("replicas: {seconds} s, at most {max_kills} kills, CORRAL_SOAK_SEED={seed}");
    let pg = PgServer::start().expect("PostgreSQL is needed for this test");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let database = format!("replicas_{}", seed % 1_000_000);
    let config = runtime
        .block_on(pg.create_database(&database))
        .expect("database");
    let effect_log = dir.path().join("effects.log");
    let manifest = manifest(&webhook(effect_log.clone()));
    let serve_config = write_config(dir.path(), &url(&config), &manifest);
    let mut rng = Rng(seed);
    let mut ledger = Ledger::default();
    let mut lives = Vec::new();
    let mut next_log = 0;
    let mut start = |lives: &mut Vec<Life>| {
        next_log += 1;
        let log = dir.path().join(format!("replica-{next_log}.log"));
        lives.push(Life { log: log.clone() });
        spawn(&serve_config, &log)
    };
    let mut replicas: Vec<Server> = (0..REPLICAS).map(|_| start(&mut lives)).collect();
    let driver = Driver {
        client: reqwest::Client::new(),
    };
    let started = Instant::now();
    let mut kills = 0;
    runtime.block_on(async {
        for replica in &replicas {
            driver.ready(&replica.base).await;
        }
        let first = replicas[0].base.clone();
        driver
            .json(
                &first,
                reqwest::Method::PUT,
                "/v1/agents/soak",
                OPERATOR,
                Some(json!({"manifest": manifest, "implementationVersion": "1"})),
            )
            .await
            .expect("register the agent");
        for index in 0..SESSIONS {
            let base = &replicas[index % REPLICAS].base;
            driver
                .json(
                    base,
                    reqwest::Method::PUT,
                    &format!("/v1/sessions/soak-{index}"),
                    OPERATOR,
                    Some(json!({"agentId": "soak", "ownerUserId": "soak"})),
                )
                .await
                .expect("create a session");
        }
        // Kill one replica at a random moment, start it again, and so on.
        let until = started + Duration::from_secs(seconds);
        while Instant::now() < until && kills < max_kills {
            let next_kill = Instant::now() + Duration::from_millis(300 + rng.below(2500));
            while Instant::now() < next_kill {
                let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
                driver.round(&bases, &mut ledger, &mut rng, true).await;
            }
            let victim = rng.below(REPLICAS as u64) as usize;
            replicas[victim].child.kill().expect("SIGKILL");
            let _ = replicas[victim].child.wait();
            kills += 1;
            // The others go on alone for a while (they take the victim's sessions over once
            // its leases expire), then it comes back.
            let back = Instant::now() + Duration::from_millis(rng.below(1500));
            let bases: Vec<String> = replicas
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != victim)
                .map(|(_, r)| r.base.clone())
                .collect();
            while Instant::now() < back {
                driver.round(&bases, &mut ledger, &mut rng, true).await;
            }
            replicas[victim] = start(&mut lives);
            driver.ready(&replicas[victim].base).await;
        }
        // No more kills and no new turns: every turn settles.
        let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if driver.round(&bases, &mut ledger, &mut rng, false).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "sessions did not settle after the kills"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // One more read of every session's new events.
        driver.round(&bases, &mut ledger, &mut rng, false).await;
    });
    for replica in &mut replicas {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(replica.child.id().to_string())
            .status();
    }
    for replica in &mut replicas {
        let _ = replica.child.wait();
    }
    runtime.block_on(check(config, &effect_log, &ledger));
    let (segments, shared) = check_exclusive(&lives);
    let performed = std::fs::read_to_string(&effect_log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    eprintln!(
        "replicas: {kills} kills in {:?}; {} turns, {} commands acknowledged, {} events seen, \
         {performed} effects performed, {segments} segments, {shared} sessions run by several replicas",
        started.elapsed(),
        ledger.turns.len(),
        ledger.acked.len(),
        ledger.seen.len()
    );
    assert!(kills > 0, "no replica was killed");
    assert!(
        ledger.turns.len() > SESSIONS,
        "the run did too little work to mean anything"
    );
    assert!(performed > 0, "no effect was performed");
    assert!(
        segments > 0,
        "no segment was logged (is corral_server::segments logging on?)"
    );
    assert!(shared > 0, "no session moved between replicas");
    runtime.block_on(async {
        let _ = pg.drop_database(&database).await;
    });
}
