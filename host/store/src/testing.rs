//! Test support shared by this crate's tests and benchmarks: a real, throwaway PostgreSQL.
//!
//! [`PgServer::start`] uses `DATABASE_URL` when it is set; otherwise it runs `initdb` and
//! `pg_ctl` (PostgreSQL binaries on `PATH` or under `/usr/lib/postgresql/*/bin`) into a
//! throwaway folder on a free loopback port, as the `postgres` user when running as root. The
//! server stops when the [`PgServer`] is dropped and, should the test process die without
//! dropping it, when a watchdog shell notices that the process's end of a pipe closed.
//! Not part of the crate's API.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::BoxError;
use crate::postgres::PostgresConfig;

/// Why no PostgreSQL server could be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartPostgresError {
    /// `DATABASE_URL` is set but cannot be parsed.
    #[error("DATABASE_URL is not a valid PostgreSQL URL: {reason}")]
    InvalidUrl {
        /// The parser's complaint.
        reason: String,
    },
    /// No `initdb`/`pg_ctl` pair was found.
    #[error(
        "no PostgreSQL server binaries (initdb and pg_ctl) on PATH or under \
         /usr/lib/postgresql/*/bin, and DATABASE_URL is not set: install PostgreSQL 15 \
         (apt-get install postgresql) or set DATABASE_URL"
    )]
    NoBinaries,
    /// Running as root, and no unprivileged account to run `initdb` as.
    #[error(
        "initdb refuses to run as root and there is no `postgres` user to run it as: \
         create one (useradd --system postgres) or set DATABASE_URL"
    )]
    NoUnprivilegedUser,
    /// A step of starting the server failed.
    #[error("starting PostgreSQL failed at {step}: {detail}")]
    Step {
        /// Which step.
        step: &'static str,
        /// What it printed or returned.
        detail: String,
    },
}

fn step(step: &'static str) -> impl FnOnce(std::io::Error) -> StartPostgresError {
    move |error| StartPostgresError::Step {
        step,
        detail: error.to_string(),
    }
}

/// A PostgreSQL server for tests: a local throwaway one, or the one `DATABASE_URL` names.
#[derive(Debug)]
pub struct PgServer {
    admin: PostgresConfig,
    local: Option<LocalServer>,
}

#[derive(Debug)]
struct LocalServer {
    folder: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    run_as: Option<String>,
    watchdog: Option<Child>,
}

impl PgServer {
    /// The server `DATABASE_URL` names, or else a local throwaway server.
    pub fn start() -> Result<Self, StartPostgresError> {
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => {
                let admin = PostgresConfig::from_str(&url).map_err(|error| {
                    StartPostgresError::InvalidUrl {
                        reason: error.to_string(),
                    }
                })?;
                Ok(Self { admin, local: None })
            }
            _ => Self::start_local(),
        }
    }

    /// A local throwaway server, whatever `DATABASE_URL` says.
    pub fn start_local() -> Result<Self, StartPostgresError> {
        let bin = find_binaries().ok_or(StartPostgresError::NoBinaries)?;
        let run_as = if current_uid().as_deref() == Some("0") {
            if output(Command::new("id").arg("-u").arg("postgres")).is_none() {
                return Err(StartPostgresError::NoUnprivilegedUser);
            }
            Some("postgres".to_owned())
        } else {
            None
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let folder = std::env::temp_dir().join(format!("corral-pg-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&folder).map_err(step("create the data folder"))?;
        let mut server = LocalServer {
            data: folder.join("data"),
            folder,
            bin,
            run_as,
            watchdog: None,
        };
        if let Some(user) = &server.run_as {
            let uid = output(Command::new("id").arg("-u").arg(user));
            let gid = output(Command::new("id").arg("-g").arg(user));
            let (Some(uid), Some(gid)) = (
                uid.and_then(|uid| uid.parse().ok()),
                gid.and_then(|gid| gid.parse().ok()),
            ) else {
                return Err(StartPostgresError::NoUnprivilegedUser);
            };
            std::os::unix::fs::chown(&server.folder, Some(uid), Some(gid))
                .map_err(step("hand the data folder to the postgres user"))?;
        }
        server.spawn_watchdog()?;
        let data = server.data.display().to_string();
        server.run(
            "initdb",
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        let port = free_port()?;
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300",
            server.folder.display()
        );
        let log = server.folder.join("log").display().to_string();
        server.run(
            "pg_ctl start",
            "pg_ctl",
            &[
                "-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60", "start",
            ],
        )?;
        let mut admin = PostgresConfig::new();
        admin
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres");
        Ok(Self {
            admin,
            local: Some(server),
        })
    }

    /// Kills a local server the way a crash would (`pg_ctl stop -m immediate`: no checkpoint,
    /// every connection cut mid-transaction), then starts it again on the same data, which runs
    /// crash recovery. Fails for a server named by `DATABASE_URL`.
    pub fn crash_and_restart(&self) -> Result<(), StartPostgresError> {
        self.crash()?;
        self.restart()
    }

    /// Kills a local server the way a crash would, and leaves it down until [`Self::restart`].
    pub fn crash(&self) -> Result<(), StartPostgresError> {
        let server = self.local_server("crash")?;
        let data = server.data.display().to_string();
        server.run(
            "pg_ctl stop -m immediate",
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "stop"],
        )?;
        Ok(())
    }

    /// Starts a local server stopped by [`Self::crash`] again, on the same port and data.
    pub fn restart(&self) -> Result<(), StartPostgresError> {
        let server = self.local_server("restart")?;
        let data = server.data.display().to_string();
        let port = self.admin.get_ports().first().copied().unwrap_or(5432);
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300",
            server.folder.display()
        );
        let log = server.folder.join("log").display().to_string();
        server.run(
            "pg_ctl start",
            "pg_ctl",
            &[
                "-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60", "start",
            ],
        )?;
        Ok(())
    }

    fn local_server(&self, step: &'static str) -> Result<&LocalServer, StartPostgresError> {
        self.local.as_ref().ok_or(StartPostgresError::Step {
            step,
            detail: "only a local server can be stopped and started".to_owned(),
        })
    }

    /// One of PostgreSQL's client programs (`pgbench`, `psql`): from the folder of the server's
    /// binaries (or of what they link to), else from `PATH`.
    pub fn client_program(&self, name: &str) -> Option<PathBuf> {
        let bin = match &self.local {
            Some(server) => Some(server.bin.clone()),
            None => find_binaries(),
        };
        let beside = bin.into_iter().flat_map(|bin| {
            let linked = std::fs::canonicalize(bin.join("initdb"))
                .ok()
                .and_then(|initdb| initdb.parent().map(Path::to_path_buf));
            [Some(bin), linked].into_iter().flatten()
        });
        let on_path = std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .unwrap_or_default();
        beside
            .chain(on_path)
            .map(|folder| folder.join(name))
            .find(|program| program.is_file())
    }

    /// Settings for the maintenance database.
    pub fn admin_config(&self) -> PostgresConfig {
        self.admin.clone()
    }

    /// Settings for `database` on this server.
    pub fn config(&self, database: &str) -> PostgresConfig {
        let mut config = self.admin.clone();
        config.dbname(database);
        config
    }

    /// Creates an empty database and returns its settings.
    pub async fn create_database(&self, database: &str) -> Result<PostgresConfig, BoxError> {
        self.admin_statement(&format!("CREATE DATABASE \"{database}\""))
            .await?;
        Ok(self.config(database))
    }

    /// Drops a database, disconnecting its clients.
    pub async fn drop_database(&self, database: &str) -> Result<(), BoxError> {
        self.admin_statement(&format!(
            "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
        ))
        .await
    }

    async fn admin_statement(&self, sql: &str) -> Result<(), BoxError> {
        let (client, connection) = self.admin.connect(tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let result = client.batch_execute(sql).await;
        drop(client);
        let _ = driver.await;
        Ok(result?)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut server) = self.local.take() {
            server.stop();
        }
    }
}

impl LocalServer {
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.arg("-u").arg(user).arg("--").arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn run(
        &self,
        step: &'static str,
        program: &str,
        args: &[&str],
    ) -> Result<(), StartPostgresError> {
        let output = self
            .command(program)
            .args(args)
            .current_dir(&self.folder)
            .stdin(Stdio::null())
            .output()
            .map_err(|error| StartPostgresError::Step {
                step,
                detail: format!("cannot run {program}: {error}"),
            })?;
        if output.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.folder.join("log")).unwrap_or_default();
        Err(StartPostgresError::Step {
            step,
            detail: format!(
                "{program} exited with {}: {}{}\n{log}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }

    /// A shell that waits for our end of its stdin to close, then stops the server and removes
    /// the folder: it runs even if this process is killed before it can clean up.
    fn spawn_watchdog(&mut self) -> Result<(), StartPostgresError> {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = match &self.run_as {
            Some(user) => format!("runuser -u {user} -- '{}'", pg_ctl.display()),
            None => format!("'{}'", pg_ctl.display()),
        };
        let script = format!(
            "trap '' INT TERM HUP; read _; {stop} -D '{}' -m immediate -w stop >/dev/null 2>&1; \
             rm -rf '{}'",
            self.data.display(),
            self.folder.display()
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(step("start the watchdog"))?;
        self.watchdog = Some(child);
        Ok(())
    }

    fn stop(&mut self) {
        let data = self.data.display().to_string();
        let stopped = self
            .run(
                "pg_ctl stop",
                "pg_ctl",
                &["-D", &data, "-m", "fast", "-w", "-t", "20", "stop"],
            )
            .is_ok();
        if !stopped {
            let _ = self.run(
                "pg_ctl stop",
                "pg_ctl",
                &["-D", &data, "-m", "immediate", "-w", "stop"],
            );
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            // Closing its stdin lets the watchdog run its (now redundant) cleanup and exit.
            if let Some(mut stdin) = watchdog.stdin.take() {
                let _ = stdin.write_all(b"\n");
            }
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

fn output(command: &mut Command) -> Option<String> {
    let output = command.stderr(Stdio::null()).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn current_uid() -> Option<String> {
    output(Command::new("id").arg("-u"))
}

/// A folder holding both `initdb` and `pg_ctl`: on PATH first, then the newest Debian layout.
fn find_binaries() -> Option<PathBuf> {
    let complete =
        |folder: &Path| folder.join("initdb").is_file() && folder.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        for folder in std::env::split_paths(&path) {
            if complete(&folder) {
                return Some(folder);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let bin = entry.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn free_port() -> Result<u16, StartPostgresError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(step("find a free port"))?;
    let port = listener
        .local_addr()
        .map_err(step("find a free port"))?
        .port();
    Ok(port)
}
