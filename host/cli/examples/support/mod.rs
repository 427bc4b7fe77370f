//! A `corral serve` child for the benchmarks (`serve_bench`, `trace_bench`): started on a
//! config of their own in a temporary folder, called with their token, killed when dropped.
//! Each benchmark adds its own measurements in an `impl Server` of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// A running `corral serve`.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub client: reqwest::Client,
    pub token: String,
    _folder: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `corral` binary built beside this example (`target/release/examples/NAME` is the
/// example).
fn corral_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(Path::parent)
        .context("no release folder")?;
    let binary = release.join("corral");
    if !binary.is_file() {
        bail!("{} is not built", binary.display());
    }
    Ok(binary)
}

impl Server {
    /// Starts `corral serve` on `config` (TOML, where `{folder}` stands for the server's own
    /// temporary folder), without the environment variables named in `clear`.
    pub fn start(
        config: &str,
        token: &str,
        client: reqwest::Client,
        clear: &[&str],
    ) -> anyhow::Result<Server> {
        let folder = tempfile::tempdir()?;
        let file = folder.path().join("serve.toml");
        std::fs::write(
            &file,
            config.replace("{folder}", &folder.path().display().to_string()),
        )?;
        let mut command = Command::new(corral_binary()?);
        command
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for var in clear {
            command.env_remove(var);
        }
        let mut child = command.spawn()?;
        let base = super::common::listening_address(&mut child)
            .context("corral serve exited before listening")?;
        Ok(Server {
            child,
            base,
            client,
            token: token.to_owned(),
            _folder: folder,
        })
    }

    /// One request with the server's token; anything but 200 panics, naming the path.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status != 200 {
                    panic!("{path}: {status} {body}");
                }
                body
            }
            Err(error) => panic!("{path}: {error}"),
        }
    }
}
