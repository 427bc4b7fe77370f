//! Fixtures shared by the test modules: backends, trials, and a TCP proxy that can cut
//! connections.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context as _, anyhow};
use corral_store::testing::PgServer;
use corral_store::{
    CommitOutcome, CommitReceipt, NewAgent, NewSession, PostgresConfig, PostgresOptions,
    PostgresStore, Session, SqliteStore, Store,
};
use libtest_mimic::{Failed, Trial};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A boxed test body.
pub type TestFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Two handles on one fresh, empty store: `store`, and `peer` standing for a second replica
/// (a second connection pool on PostgreSQL; the same handle on the single-process embedded store).
pub struct Fixture {
    pub store: Arc<dyn Store>,
    pub peer: Arc<dyn Store>,
}

/// State shared by all trials of the binary: the PostgreSQL server, started on first use and
/// stopped when the last trial is done.
#[derive(Default)]
pub struct Harness {
    postgres: OnceLock<Result<PgServer, String>>,
}

static DATABASES: AtomicUsize = AtomicUsize::new(0);

impl Harness {
    /// The PostgreSQL server, or why there is none (which fails the calling test).
    pub fn postgres(&self) -> anyhow::Result<&PgServer> {
        self.postgres
            .get_or_init(|| PgServer::start().map_err(|error| error.to_string()))
            .as_ref()
            .map_err(|reason| {
                anyhow!("PostgreSQL is required by this test and could not be had: {reason}")
            })
    }

    /// A fresh database on the server, dropped by the guard.
    pub async fn database(self: &Arc<Self>) -> anyhow::Result<Database> {
        let server = self.postgres()?;
        let name = format!(
            "corral_test_{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let config = server
            .create_database(&name)
            .await
            .map_err(|error| anyhow!("creating database {name}: {error}"))?;
        Ok(Database {
            harness: Arc::clone(self),
            name,
            config,
        })
    }
}

/// A database of one test.
pub struct Database {
    harness: Arc<Harness>,
    pub name: String,
    pub config: PostgresConfig,
}

impl Database {
    pub async fn connect(&self) -> anyhow::Result<PostgresStore> {
        PostgresStore::connect(PostgresOptions::new(self.config.clone()))
            .await
            .with_context(|| format!("connecting to {}", self.name))
    }

    /// A plain client for inspecting or tampering with the database.
    pub async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = self.config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }

    pub async fn drop_database(self) -> anyhow::Result<()> {
        let server = self.harness.postgres()?;
        server
            .drop_database(&self.name)
            .await
            .map_err(|error| anyhow!("dropping database {}: {error}", self.name))
    }
}

/// Runs an async test body on a multi-threaded runtime, so concurrency tests really race.
pub fn run(body: impl Future<Output = anyhow::Result<()>>) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|error| Failed::from(format!("cannot build a runtime: {error}")))?;
    runtime
        .block_on(body)
        .map_err(|error| Failed::from(format!("{error:?}")))
}

/// A trial running `test` against a fresh embedded store in a temporary folder.
pub fn sqlite_trial(name: String, test: fn(Fixture) -> TestFuture) -> Trial {
    Trial::test(name, move || {
        run(async move {
            let folder = tempfile::tempdir()?;
            let store: Arc<dyn Store> =
                Arc::new(SqliteStore::open(folder.path().join("corral.db"))?);
            let fixture = Fixture {
                store: Arc::clone(&store),
                peer: store,
            };
            test(fixture).await
        })
    })
}

/// A trial running `test` against a fresh PostgreSQL database with two connection pools.
pub fn postgres_trial(
    harness: &Arc<Harness>,
    name: String,
    test: fn(Fixture) -> TestFuture,
) -> Trial {
    let harness = Arc::clone(harness);
    Trial::test(name, move || {
        run(async move {
            let database = harness.database().await?;
            let store = database.connect().await?;
            let peer = database.connect().await?;
            let fixture = Fixture {
                store: Arc::new(store.clone()),
                peer: Arc::new(peer.clone()),
            };
            let outcome = test(fixture).await;
            store.close();
            peer.close();
            database.drop_database().await?;
            outcome
        })
    })
}

/// A trial needing the harness (PostgreSQL-specific tests).
pub fn harness_trial(
    harness: &Arc<Harness>,
    name: &str,
    test: fn(Arc<Harness>) -> TestFuture,
) -> Trial {
    let harness = Arc::clone(harness);
    Trial::test(name, move || run(test(harness)))
}

/// A registered agent and a session `id` of tenant `acme` talking to it.
pub async fn session(store: &dyn Store, id: &str) -> anyhow::Result<Session> {
    session_of(store, id, "acme").await
}

pub async fn session_of(store: &dyn Store, id: &str, tenant: &str) -> anyhow::Result<Session> {
    store
        .put_agent(NewAgent::new(
            "helper",
            json!({"id": "helper", "tools": ["lookup"]}),
            "sha256:helper-1",
            "1.0.0",
        ))
        .await?;
    let created = store
        .create_session(NewSession::new(
            id,
            tenant,
            "alice",
            "helper",
            json!({"agentId": "helper", "ownerUserId": "alice"}),
        ))
        .await?;
    Ok(created.session)
}

/// The receipt of a commit that must have applied.
pub fn applied(outcome: CommitOutcome) -> anyhow::Result<CommitReceipt> {
    match outcome {
        CommitOutcome::Applied(receipt) => Ok(*receipt),
        CommitOutcome::Replayed(record) => Err(anyhow!(
            "expected an applied commit, got a replay of {record:?}"
        )),
        other => Err(anyhow!("unexpected outcome {other:?}")),
    }
}

/// A TCP proxy in front of the database that can drop every connection and refuse new ones,
/// as a network partition or a database crash would. It counts the `ReadyForQuery` messages
/// the server sends on each connection (one per `Sync` or simple query it answered, each
/// flushed on its own), for connections that do not negotiate TLS.
pub struct Proxy {
    pub address: SocketAddr,
    /// `ReadyForQuery` messages relayed so far, per connection, in the order they were accepted.
    answers: Arc<Mutex<Vec<Arc<AtomicU64>>>>,
    upstream: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let mut proxy = Self {
            address,
            answers: Arc::default(),
            upstream,
            tasks: Arc::default(),
            acceptor: None,
        };
        proxy.accept(listener);
        Ok(proxy)
    }

    fn accept(&mut self, listener: TcpListener) {
        let tasks = Arc::clone(&self.tasks);
        let upstream = self.upstream;
        let answers = Arc::clone(&self.answers);
        self.acceptor = Some(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = Arc::<AtomicU64>::default();
                answers
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(Arc::clone(&counted));
                let answers = counted;
                let relay = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, &answers).await;
                    }
                });
                tasks
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(relay);
            }
        }));
    }

    /// Drops every relayed connection and stops listening, and waits until both happened.
    pub async fn cut(&mut self) {
        let mut tasks: Vec<JoinHandle<()>> = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        tasks.extend(self.acceptor.take());
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }

    /// The `ReadyForQuery` messages relayed so far on each connection, in the order they were
    /// accepted.
    pub fn answers(&self) -> Vec<u64> {
        self.answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|count| count.load(Ordering::SeqCst))
            .collect()
    }

    /// Listens again on the same address.
    pub async fn restore(&mut self) -> anyhow::Result<()> {
        let listener = TcpListener::bind(self.address).await?;
        self.accept(listener);
        Ok(())
    }
}

/// Copies bytes both ways until either side closes, counting the server's `ReadyForQuery`
/// messages (type `Z`) as they pass.
async fn relay(client: TcpStream, server: TcpStream, answers: &AtomicU64) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let read = server_read.read(&mut buffer).await?;
            if read == 0 {
                return std::io::Result::Ok(());
            }
            client_write.write_all(&buffer[..read]).await?;
            pending.extend_from_slice(&buffer[..read]);
            // Every backend message: a type byte, then its length (itself included).
            while let Some(header) = pending.get(..5) {
                let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                let whole = 1 + length as usize;
                if pending.len() < whole {
                    break;
                }
                if header[0] == b'Z' {
                    answers.fetch_add(1, Ordering::SeqCst);
                }
                pending.drain(..whole);
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .chain(&self.acceptor)
        {
            task.abort();
        }
    }
}
