//! The operator console (`/console`) in a real browser: Debian's headless Chromium, driven over
//! WebDriver (chromedriver; the commands in `console/webdriver.rs`), against a real `corral serve` with the chat
//! runtime and the scripted demo agent. It signs in, watches a session's events arrive live,
//! approves a paused script (by mouse and by keyboard only) and sees the turn complete, rejects
//! one, settles an effect left uncertain by a SIGKILL of the server, checks the tenant boundary
//! and that everything a user, a model or a script wrote is shown as text, and checks the
//! security headers. Screenshots of each page go to `$CARGO_TARGET_DIR/test-logs/console/`.
//!
//! `host/cli/tests/install-console-tools.sh` installs Chromium and chromedriver (scripts/test
//! runs it); the test fails with that instruction when they are missing.

#![cfg(unix)]

mod webdriver;

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use corral_store::PostgresHost;
use corral_store::testing::PgServer;
use serde_json::{Value, json};

use crate::common::{self, Server, call, free_port};

const OPERATOR: &str = "console-operator-token-0001";
const ACME: &str = "console-acme-tenant-token-01";
const BETA: &str = "console-beta-tenant-token-01";
/// How long a browser-side condition may take before the test fails (generous: 2 shared cores).
const PATIENCE: Duration = Duration::from_secs(60);

/// What the XSS agent's script returns and logs: markup, a closing script tag, a `javascript:`
/// URL and control characters (NUL, ESC, a right-to-left override).
const XSS_CODE: &str = r#"console.log("log <img src=x onerror=window.pwned=5> \u0000\u001b[31m\u202eevil");
return {img: "<img src=x onerror=window.pwned=3>", close: "</script><script>window.pwned=6</script>", url: "javascript:window.pwned=7", ctl: "a\u0000b\u001b[31mc\u202ed"};"#;

fn test_logs() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let folder = target.join("test-logs/console");
    std::fs::create_dir_all(&folder).expect("test-logs folder");
    folder
}

/// axe-core's browser build, installed by `host/cli/tests/install-console-tools.sh`.
fn axe_source() -> String {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let path = target.join("node-tools/console/node_modules/axe-core/axe.min.js");
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run host/cli/tests/install-console-tools.sh (scripts/test does)",
            path.display()
        )
    })
}

/// The embedded store's URL, in `folder`.
fn embedded(folder: &Path) -> String {
    format!("sqlite:{}", folder.join("corral.db").display())
}

/// A PostgreSQL server the harness starts (`initdb`, as an unprivileged user when root) and a
/// fresh database on it, as a `store =` URL. The server lives as long as the returned handle.
async fn postgres(database: &str) -> (PgServer, String) {
    let pg = tokio::task::block_in_place(PgServer::start)
        .expect("PostgreSQL is needed for this test (scripts/test installs it)");
    let config = pg.create_database(database).await.expect("database");
    let host = match config.get_hosts().first() {
        Some(PostgresHost::Tcp(host)) => host.clone(),
        other => panic!("the test database has no TCP host: {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    (pg, format!("postgres://{user}@{host}:{port}/{database}"))
}

impl Server {
    /// A `corral serve --config` child on the embedded store, in `folder`.
    fn console(folder: &Path, listen: &str) -> Server {
        Server::console_on(folder, listen, &embedded(folder))
    }

    /// On `store` (a `store =` URL), with its configuration and log in `folder`.
    fn console_on(folder: &Path, listen: &str, store: &str) -> Server {
        let config = folder.join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"{listen}\"\nstore = \"{store}\"\nleaseMs = 2000\n\
                 [[tokens]]\ntoken = \"{OPERATOR}\"\nrole = \"application\"\n\
                 [[tokens]]\ntoken = \"{ACME}\"\nrole = \"application\"\ntenant = \"acme\"\n\
                 [[tokens]]\ntoken = \"{BETA}\"\nrole = \"application\"\ntenant = \"beta\"\n"
            ),
        )
        .expect("config");
        Server::start(&config, &folder.join("serve.stderr"))
    }
}

/// chromedriver on a free port, and a headless Chromium session through it.
struct Browser {
    driver: Child,
    session: Option<webdriver::Session>,
    shots: PathBuf,
}

impl Browser {
    async fn start(name: &str) -> Browser {
        let chromedriver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!(
                    "chromedriver is not installed: run `bash host/cli/tests/install-console-tools.sh` \
                     (scripts/test does)"
                )
            });
        let port = free_port();
        let mut driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut lines = BufReader::new(driver.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("started successfully") => break,
                Some(Ok(_)) => continue,
                _ => panic!("chromedriver exited before it was ready"),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let session = webdriver::Session::start(
            &format!("http://127.0.0.1:{port}"),
            json!({"goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000", "--lang=en-US"]
            }}),
        )
        .await
        .expect("a Chromium session");
        let shots = test_logs().join(name);
        std::fs::create_dir_all(&shots).expect("screenshot folder");
        Browser {
            driver,
            session: Some(session),
            shots,
        }
    }

    fn session(&self) -> &webdriver::Session {
        self.session.as_ref().expect("the browser session")
    }

    async fn goto(&self, url: &str) {
        self.session().goto(url).await.expect("navigate");
    }

    /// Evaluates `expression` in the page.
    async fn eval(&self, expression: &str) -> Value {
        self.session()
            .execute(&format!("return ({expression});"))
            .await
            .unwrap_or_else(|e| panic!("evaluating {expression}: {e}"))
    }

    /// Waits until `expression` is truthy in the page (re-evaluated as the page changes).
    async fn until(&self, what: &str, expression: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self
                .session()
                .execute(&format!("return Boolean({expression});"))
                .await;
            if matches!(value, Ok(Value::Bool(true))) {
                return;
            }
            if Instant::now() > deadline {
                self.shot(&format!("timeout-{}", what.replace(' ', "-")))
                    .await;
                let text = self.eval("document.body.innerText").await;
                panic!("timed out waiting for {what} ({expression}); the page reads:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn click(&self, selector: &str) {
        let element = self
            .session()
            .find(selector)
            .await
            .unwrap_or_else(|e| panic!("no {selector}: {e}"));
        self.session()
            .click(&element)
            .await
            .unwrap_or_else(|e| panic!("clicking {selector}: {e}"));
    }

    /// Clicks the button whose text is `label` (within `scope`, a CSS selector).
    async fn press(&self, scope: &str, label: &str) {
        let buttons = self
            .session()
            .find_all(&format!("{scope} button"))
            .await
            .expect("buttons");
        for button in buttons {
            if self
                .session()
                .text(&button)
                .await
                .unwrap_or_default()
                .trim()
                == label
            {
                self.session().click(&button).await.expect("click");
                return;
            }
        }
        panic!("no button {label:?} in {scope}");
    }

    async fn type_into(&self, selector: &str, text: &str) {
        let field = self
            .session()
            .find(selector)
            .await
            .unwrap_or_else(|e| panic!("no {selector}: {e}"));
        self.session().clear(&field).await.expect("clear");
        self.session().type_text(&field, text).await.expect("type");
    }

    /// Presses one key on whatever has the focus.
    async fn key(&self, key: char) {
        self.session().press_key(key).await.expect("key press");
    }

    async fn shot(&self, name: &str) {
        if let Ok(png) = self.session().screenshot().await {
            let _ = std::fs::write(self.shots.join(format!("{name}.png")), png);
        }
    }

    async fn sign_in(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/console/")).await;
        self.until("the sign-in form", "document.querySelector('#token')")
            .await;
        self.type_into("#token", token).await;
        self.click("form.signin button[type=submit]").await;
        self.until(
            "the sessions page",
            "document.querySelector('main h1')?.textContent === 'Sessions' && !document.querySelector('main p')?.textContent.startsWith('Loading')",
        )
        .await;
    }

    async fn sign_out(&self) {
        self.click("#sign-out").await;
        self.until("the sign-in form", "document.querySelector('#token')")
            .await;
    }

    async fn open_session(&self, base: &str, tenant: &str, id: &str) {
        self.goto(&format!("{base}/console/#/session/{tenant}/{id}"))
            .await;
        self.until(
            "the session's live stream",
            &format!(
                "document.querySelector('main h1')?.textContent === 'Session {id}' && document.querySelector('#live-state')?.dataset.state === 'live'"
            ),
        )
        .await;
    }

    async fn main_text(&self) -> String {
        self.eval("document.querySelector('main').innerText")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs the axe-core accessibility engine on the page as it is and fails on any serious or
    /// critical violation (WCAG 2 A and AA rules, and axe's best practices).
    async fn accessible(&self, what: &str) {
        let axe = axe_source();
        self.session()
            .execute(&format!("{axe}\nreturn typeof window.axe;"))
            .await
            .expect("axe-core loads in the page");
        let violations = self
            .session()
            .execute(
                "return window.axe.run(document, {resultTypes: ['violations']}).then((r) => \
                 r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help, \
                 nodes: v.nodes.map((n) => n.target.join(' '))})));",
            )
            .await
            .expect("axe.run");
        let serious: Vec<&Value> = violations
            .as_array()
            .expect("violations")
            .iter()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .collect();
        assert!(
            serious.is_empty(),
            "{what}: accessibility violations {serious:#?}"
        );
    }

    async fn stop(mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed test still closes Chromium (chromedriver ends it with the session).
        if let Some(session) = self.session.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            tokio::task::block_in_place(|| {
                let _ = handle.block_on(session.close());
            });
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn ok(token: &str, base: &str, method: reqwest::Method, path: &str, body: Value) -> Value {
    let body = (method != reqwest::Method::GET).then_some(body);
    let (status, answer) = call(token, base, method, path, body).await;
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

fn demo_manifest() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-agent.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("demo agent")).expect("json")
}

/// Registers `manifest` as the operator, shared with every tenant.
async fn register(base: &str, manifest: Value) {
    let id = manifest["id"].as_str().expect("id").to_owned();
    ok(
        OPERATOR,
        base,
        reqwest::Method::PUT,
        &format!("/v1/agents/{id}"),
        json!({"manifest": manifest, "implementationVersion": "1", "sharedWith": ["*"]}),
    )
    .await;
}

async fn create_session(base: &str, token: &str, id: &str, agent: &str, owner: &str) {
    ok(
        token,
        base,
        reqwest::Method::PUT,
        &format!("/v1/sessions/{id}"),
        json!({"agentId": agent, "ownerUserId": owner}),
    )
    .await;
}

async fn send_message(base: &str, token: &str, id: &str, key: &str, content: &str) {
    ok(
        token,
        base,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/commands"),
        json!({"type": "message", "idempotencyKey": key, "content": content}),
    )
    .await;
}

async fn session(base: &str, token: &str, id: &str) -> Value {
    ok(
        token,
        base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}"),
        Value::Null,
    )
    .await
}

async fn events(base: &str, token: &str, id: &str) -> Vec<Value> {
    let page = ok(
        token,
        base,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/items?cursor=0&limit=1000"),
        Value::Null,
    )
    .await;
    page["items"].as_array().cloned().unwrap_or_default()
}

/// The decisions (`command.approve`) recorded in a session's history.
async fn decisions(base: &str, token: &str, id: &str) -> Vec<Value> {
    events(base, token, id)
        .await
        .into_iter()
        .filter(|e| e["type"] == "command.approve")
        .map(|e| e["data"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_approves_rejects_and_keeps_tenants_apart() {
    let folder = tempfile::tempdir().expect("tempdir");
    let store = embedded(folder.path());
    approve_reject_and_tenants(folder.path(), &store, "approve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_approves_rejects_and_keeps_tenants_apart_on_postgres() {
    let folder = tempfile::tempdir().expect("tempdir");
    let (_pg, store) = postgres("console_approve").await;
    approve_reject_and_tenants(folder.path(), &store, "approve-postgres").await;
}

/// Signs in, watches a session live, approves by mouse and by keyboard, rejects, checks the
/// tenant boundary and the operator's pages, on `store`; screenshots go to `shots`.
async fn approve_reject_and_tenants(folder: &Path, store: &str, shots: &str) {
    let server = Server::console_on(folder, "127.0.0.1:0", store);
    let base = server.base.clone();
    register(&base, demo_manifest()).await;
    create_session(&base, ACME, "s1", "demo", "ada").await;
    create_session(&base, ACME, "s2", "demo", "bob").await;
    let browser = Browser::start(shots).await;

    // Sign in as acme's tenant token; the sign-in page is the first screenshot.
    browser.goto(&format!("{base}/console/")).await;
    browser
        .until("the sign-in form", "document.querySelector('#token')")
        .await;
    browser.shot("01-sign-in").await;
    browser.accessible("the sign-in page").await;
    browser.sign_in(&base, ACME).await;
    assert_eq!(
        browser
            .eval("sessionStorage.getItem('corral.console.token')")
            .await,
        json!(ACME),
        "the token is kept in sessionStorage"
    );
    assert_eq!(
        browser.eval("document.cookie").await,
        json!(""),
        "no cookie"
    );
    assert!(
        !browser
            .session()
            .current_url()
            .await
            .expect("url")
            .contains(ACME),
        "the token is never in the URL"
    );
    let text = browser.main_text().await;
    assert!(
        text.contains("s1") && text.contains("s2"),
        "both sessions: {text}"
    );
    browser.shot("02-sessions").await;
    browser.accessible("the sessions page").await;

    // The session is idle when the page opens: the message, the pause and the script arrive
    // over the live stream, without a reload.
    browser.open_session(&base, "acme", "s1").await;
    browser
        .until(
            "the message form",
            "document.querySelector('#message-heading')",
        )
        .await;
    send_message(&base, ACME, "s1", "m1", "Run two sleeps at once").await;
    browser
        .until(
            "the user message, live",
            "[...document.querySelectorAll('.type-command-message .text')].some(p => p.textContent === 'Run two sleeps at once')",
        )
        .await;
    browser
        .until(
            "the pending approval",
            "document.querySelector('.card.pending pre.code')",
        )
        .await;
    let view = session(&base, ACME, "s1").await;
    assert_eq!(view["status"], "paused");
    let sha = view["waits"][0]["argumentsSha256"]
        .as_str()
        .expect("sha")
        .to_owned();
    let card = browser
        .eval("document.querySelector('.card.pending').innerText")
        .await;
    let card = card.as_str().unwrap_or_default();
    assert!(
        card.contains(&sha),
        "the card shows argumentsSha256: {card}"
    );
    assert!(
        card.contains("tools.examples.sleep({ ms: 200 })"),
        "the card shows the script: {card}"
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('.card.pending pre.code .tok-keyword').length > 0")
            .await,
        json!(true),
        "the script is highlighted"
    );
    browser.shot("03-session-paused").await;
    browser.accessible("a paused session").await;

    // Approve with the mouse: the turn completes, live.
    browser.press(".card.pending", "Approve").await;
    browser
        .until(
            "the completed turn",
            "document.querySelector('.type-turn-completed') && document.querySelector('#session-facts .badge')?.textContent === 'completed'",
        )
        .await;
    let text = browser.main_text().await;
    assert!(
        text.contains("Both sleeps ran at once; the echo said hello."),
        "the model's answer: {text}"
    );
    assert!(
        text.contains("approved by tenant:acme"),
        "who decided: {text}"
    );
    assert!(text.contains("peak memory"), "the script's stats: {text}");
    assert!(
        text.contains("\"slept_ms\": 200"),
        "the script's value: {text}"
    );
    assert_eq!(session(&base, ACME, "s1").await["status"], "completed");
    let decided = decisions(&base, ACME, "s1").await;
    assert_eq!(decided.len(), 1, "one click, one command: {decided:?}");
    assert_eq!(decided[0]["approved"], true);
    assert_eq!(decided[0]["decidedBy"], "tenant:acme");
    browser.shot("04-session-completed").await;
    browser.accessible("a completed session").await;

    // Reject the other session's script with a reason: the model sees the rejection.
    send_message(&base, ACME, "s2", "m1", "Run two sleeps at once").await;
    browser.open_session(&base, "acme", "s2").await;
    browser
        .until(
            "the pending approval",
            "document.querySelector('.card.pending')",
        )
        .await;
    let reason = browser
        .eval("document.querySelector('.card.pending textarea').id")
        .await;
    browser
        .type_into(&format!("#{}", reason.as_str().expect("id")), "not today")
        .await;
    browser.press(".card.pending", "Reject").await;
    browser
        .until(
            "the rejection in the timeline",
            "[...document.querySelectorAll('.entry-interaction .decision')].some(p => p.textContent.startsWith('rejected by tenant:acme') && p.textContent.includes('not today'))",
        )
        .await;
    let decided = decisions(&base, ACME, "s2").await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["approved"], false);
    assert_eq!(decided[0]["reason"], "not today");
    browser.shot("05-session-rejected").await;

    // Keyboard only: a third session, approved by Tab and Enter alone.
    create_session(&base, ACME, "s3", "demo", "cy").await;
    send_message(&base, ACME, "s3", "m1", "Run two sleeps at once").await;
    browser.open_session(&base, "acme", "s3").await;
    browser
        .until(
            "the pending approval",
            "document.querySelector('.card.pending button.approve')",
        )
        .await;
    browser.eval("document.activeElement.blur() || true").await;
    let mut reached = false;
    for _ in 0..60 {
        let focused = browser
            .eval("document.activeElement?.textContent ?? ''")
            .await;
        if focused == json!("Approve") {
            reached = true;
            break;
        }
        browser.key(webdriver::TAB).await;
    }
    assert!(reached, "Tab reaches the Approve button");
    browser.shot("06-keyboard-focus-approve").await;
    browser.key(webdriver::ENTER).await;
    browser
        .until(
            "the completed turn",
            "document.querySelector('#session-facts .badge')?.textContent === 'completed'",
        )
        .await;
    assert_eq!(decisions(&base, ACME, "s3").await[0]["approved"], true);

    // Every control the approve flow uses has a label.
    let unlabelled = browser
        .eval(
            "[...document.querySelectorAll('main input, main select, main textarea')].filter(e => !e.labels || e.labels.length === 0).map(e => e.id)",
        )
        .await;
    assert_eq!(unlabelled, json!([]), "controls without a label");

    // The tenant boundary: beta sees none of acme's sessions, by any URL.
    browser.sign_out().await;
    assert_eq!(
        browser
            .eval("sessionStorage.getItem('corral.console.token')")
            .await,
        Value::Null,
        "signing out forgets the token"
    );
    browser.sign_in(&base, BETA).await;
    let text = browser.main_text().await;
    assert!(text.contains("No sessions match"), "beta's list: {text}");
    for (route, status) in [
        ("#/session/acme/s1", "403"),
        ("#/session/beta/s1", "404"),
        ("#/session/default/s1", "403"),
    ] {
        browser.goto(&format!("{base}/console/{route}")).await;
        browser
            .until("the error", "document.querySelector('main .error')")
            .await;
        let text = browser.main_text().await;
        assert!(text.contains(status), "{route}: {text}");
        assert!(
            !text.contains("tools.examples") && !text.contains("ada"),
            "{route} shows nothing of acme's: {text}"
        );
    }
    browser.shot("07-tenant-boundary").await;
    browser.goto(&format!("{base}/console/#/actions")).await;
    browser
        .until(
            "the actions page",
            "!document.querySelector('main p')?.textContent.startsWith('Loading')",
        )
        .await;
    assert!(!browser.main_text().await.contains("s1"));

    // The operator sees every tenant, the agents and the server panel.
    browser.sign_out().await;
    browser.sign_in(&base, OPERATOR).await;
    let text = browser.main_text().await;
    assert!(text.contains("acme") && text.contains("s3"), "{text}");
    browser.goto(&format!("{base}/console/#/agents")).await;
    browser
        .until(
            "the agents",
            "document.querySelector('main .card h2')?.textContent === 'demo'",
        )
        .await;
    assert!(browser.main_text().await.contains("sha256:"));
    browser.shot("08-agents").await;
    browser.accessible("the agents page").await;
    browser.goto(&format!("{base}/console/#/server")).await;
    browser
        .until("the metrics", "document.querySelector('main table')")
        .await;
    let text = browser.main_text().await;
    assert!(
        text.contains("corral_commands_total") && text.contains("store"),
        "{text}"
    );
    browser.shot("09-server").await;
    browser.accessible("the server page").await;
    browser.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_what_scripts_users_and_models_wrote_as_text() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = Server::console(folder.path(), "127.0.0.1:0");
    let base = server.base.clone();
    register(
        &base,
        json!({
            "id": "xss",
            "instructions": "Test.",
            "model": {"provider": "scripted", "replies": [
                {"toolCalls": [{"name": "run_js", "arguments": {"code": XSS_CODE}}]},
                {"text": "<img src=x onerror=window.pwned=4> javascript:window.pwned=8 \u{202e}done"}
            ]},
            "autoConfirm": true,
            "capabilities": []
        }),
    )
    .await;
    let owner = "<img src=x onerror=window.pwned=1>";
    create_session(&base, OPERATOR, "x1", "xss", owner).await;
    send_message(
        &base,
        OPERATOR,
        "x1",
        "m1",
        "</script><script>window.pwned=2</script>",
    )
    .await;
    let browser = Browser::start("xss").await;
    browser.sign_in(&base, OPERATOR).await;
    assert!(
        browser.main_text().await.contains(owner),
        "the owner as text"
    );
    browser.open_session(&base, "default", "x1").await;
    browser
        .until(
            "the completed turn",
            "document.querySelector('.type-turn-completed')",
        )
        .await;
    browser.shot("01-xss-session").await;
    let text = browser.main_text().await;
    for literal in [
        owner,
        "</script><script>window.pwned=2</script>",
        "<img src=x onerror=window.pwned=3>",
        "</script><script>window.pwned=6</script>",
        "javascript:window.pwned=7",
        "<img src=x onerror=window.pwned=4>",
        "log <img src=x onerror=window.pwned=5>",
        // Control characters are shown, escaped: JSON escapes them in values; the console
        // escapes them (and the right-to-left override) in logs and text.
        "a\\u0000b\\u001b[31mc\\u{202e}d",
        "\\u{0}\\u{1b}[31m\\u{202e}evil",
        "\\u{202e}done",
    ] {
        assert!(
            text.contains(literal),
            "{literal:?} shown as text in:\n{text}"
        );
    }
    assert_eq!(
        browser.eval("window.pwned === undefined").await,
        json!(true)
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('main img, main script, main iframe, main object').length")
            .await,
        json!(0),
        "no element made from data"
    );
    assert_eq!(
        browser
            .eval("[...document.querySelectorAll('a')].filter(a => !a.getAttribute('href').startsWith('#')).length")
            .await,
        json!(0),
        "every link is one of the console's own routes"
    );
    assert!(!text.contains('\u{202e}'), "no raw right-to-left override");
    browser.stop().await;
}

/// The sessions page asks the API for its filters, counts and pages: 55 of ada's sessions show
/// as two pages of 50 and 5, the counts are the server's over every page, and a status with no
/// session shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_and_filters_sessions_through_the_api() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = Server::console(folder.path(), "127.0.0.1:0");
    let base = server.base.clone();
    register(&base, demo_manifest()).await;
    for n in 0..55 {
        create_session(&base, ACME, &format!("p{n:02}"), "demo", "ada").await;
    }
    create_session(&base, ACME, "other", "demo", "bob").await;
    create_session(&base, BETA, "elsewhere", "demo", "ada").await;
    let browser = Browser::start("paging").await;
    browser.sign_in(&base, OPERATOR).await;

    let loaded = "document.querySelector('main h1')?.textContent === 'Sessions' && \
                  !document.querySelector('main p')?.textContent.startsWith('Loading')";
    browser
        .goto(&format!("{base}/console/#/sessions?tenant=acme&owner=ada"))
        .await;
    browser
        .until(
            "the first page",
            &format!("{loaded} && document.querySelector('caption')?.textContent === '55 sessions, 1 to 50 shown'"),
        )
        .await;
    assert_eq!(
        browser
            .eval("document.querySelectorAll('tbody tr').length")
            .await,
        json!(50)
    );
    let counts = browser
        .eval("document.querySelector('ul.counts').innerText")
        .await;
    assert!(
        counts.as_str().unwrap_or_default().contains("idle 55"),
        "{counts}"
    );
    let text = browser.main_text().await;
    assert!(
        !text.contains("other") && !text.contains("elsewhere"),
        "{text}"
    );
    browser.shot("10-sessions-page-1").await;

    browser.click("nav.pager a").await;
    browser
        .until(
            "the second page",
            "document.querySelector('caption')?.textContent === '55 sessions, 51 to 55 shown'",
        )
        .await;
    assert_eq!(
        browser
            .eval("document.querySelectorAll('tbody tr').length")
            .await,
        json!(5)
    );
    let text = browser.main_text().await;
    assert!(text.contains("p54") && !text.contains("p00"), "{text}");
    assert_eq!(
        browser
            .eval("[...document.querySelectorAll('nav.pager a')].map((a) => a.textContent)")
            .await,
        json!(["← First page"]),
        "the last page links back to the first only"
    );

    // A status with no session in it: nothing, whatever the other pages held.
    browser
        .goto(&format!(
            "{base}/console/#/sessions?tenant=acme&status=paused"
        ))
        .await;
    browser
        .until(
            "an empty list",
            &format!(
                "{loaded} && document.querySelector('main').innerText.includes('No sessions match')"
            ),
        )
        .await;
    browser.stop().await;
}

/// Every event of a session, paged through the API.
async fn event_count(base: &str, token: &str, id: &str) -> usize {
    let mut cursor = 0;
    let mut count = 0;
    loop {
        let page = ok(
            token,
            base,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}/items?cursor={cursor}&limit=1000"),
            Value::Null,
        )
        .await;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        let Some(last) = items.last() else {
            return count;
        };
        count += items.len();
        cursor = last["cursor"].as_u64().expect("cursor");
    }
}

/// `n` as the console writes it (`30,123`).
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A session of more than 30,000 events (30 turns, each a script and a reply streamed as 1,000
/// deltas) opens with every event folded and one page of entries in the document. How long it
/// took is measured and written to the test logs (`console/open-30000-events.txt`), not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_opens_a_session_of_30000_events() {
    const TURNS: usize = 30;
    let folder = tempfile::tempdir().expect("tempdir");
    let server = Server::console(folder.path(), "127.0.0.1:0");
    let base = server.base.clone();
    let words = vec!["word"; 1000].join(" ");
    let replies: Vec<Value> = (0..TURNS)
        .flat_map(|turn| {
            [
                json!({"toolCalls": [{"name": "run_js", "arguments": {"code": format!("return {turn};")}}]}),
                json!({"text": words}),
            ]
        })
        .collect();
    register(
        &base,
        json!({
            "id": "long",
            "instructions": "Test.",
            "model": {"provider": "scripted", "replies": replies},
            "autoConfirm": true,
            "capabilities": []
        }),
    )
    .await;
    create_session(&base, OPERATOR, "long", "long", "ada").await;
    for turn in 0..TURNS {
        send_message(&base, OPERATOR, "long", &format!("m{turn}"), "Go on").await;
        let deadline = Instant::now() + PATIENCE;
        while session(&base, OPERATOR, "long").await["status"] != "completed" {
            assert!(Instant::now() < deadline, "turn {turn} did not complete");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let total = event_count(&base, OPERATOR, "long").await;
    assert!(total >= 30_000, "{total} events");

    let browser = Browser::start("long").await;
    browser.sign_in(&base, OPERATOR).await;
    let started = Instant::now();
    browser
        .goto(&format!("{base}/console/#/session/default/long"))
        .await;
    browser
        .until(
            "every event folded",
            &format!(
                "document.querySelector('#live-state')?.dataset.state === 'live' && \
                 document.querySelector('#timeline-pages')?.textContent.includes('{} events')",
                grouped(total)
            ),
        )
        .await;
    let opened = started.elapsed();
    let entries = browser
        .eval("document.querySelectorAll('#timeline .entry').length")
        .await;
    let entries = entries.as_u64().expect("entries");
    assert!(
        (1..=100).contains(&entries),
        "one page of entries in the document: {entries}"
    );
    // The newest entries are shown: the last turn's reply.
    assert!(browser.main_text().await.contains("word word"));
    browser.shot("11-session-30000-events").await;
    let note = format!(
        "{total} events ({TURNS} turns) opened in {} ms (navigation to every event folded, \
         headless Chromium, embedded store)\n",
        opened.as_millis()
    );
    eprint!("{note}");
    std::fs::write(test_logs().join("open-30000-events.txt"), note).expect("note");
    browser.stop().await;
}

/// The console's responses carry the security headers, whatever the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_responses_carry_the_security_headers() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = Server::console(folder.path(), "127.0.0.1:0");
    for (path, content_type) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/", "text/html; charset=utf-8"),
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/api.js", "text/javascript; charset=utf-8"),
        ("/console/render.js", "text/javascript; charset=utf-8"),
        ("/console/style.css", "text/css; charset=utf-8"),
    ] {
        let response = reqwest::get(format!("{}{path}", server.base))
            .await
            .expect("get");
        assert_eq!(response.status(), 200, "{path}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(header("content-type"), content_type, "{path}");
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {directive} in {csp}");
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
    }
    // The page loads its code from files only: no inline script or style to allow.
    let page = reqwest::get(format!("{}/console/", server.base))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(page.contains("<script type=\"module\" src=\"/console/app.js\"></script>"));
    assert_eq!(page.matches("<script").count(), 1, "one script, by src");
    assert!(!page.contains("style="), "no inline style");
    // Anything else under /console is the API's 404, and the API's routes are unchanged.
    let response = reqwest::get(format!("{}/console/nope.js", server.base))
        .await
        .expect("get");
    assert_eq!(response.status(), 404);
}

/// An effect left uncertain by a SIGKILL of the server is settled from the console, after a
/// confirmation: `retry` calls the webhook again and the turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_resolves_an_uncertain_effect_after_a_sigkill() {
    let folder = tempfile::tempdir().expect("tempdir");
    let store = embedded(folder.path());
    resolve_after_sigkill(folder.path(), &store, "uncertain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_resolves_an_uncertain_effect_after_a_sigkill_on_postgres() {
    let folder = tempfile::tempdir().expect("tempdir");
    let (_pg, store) = postgres("console_uncertain").await;
    resolve_after_sigkill(folder.path(), &store, "uncertain-postgres").await;
}

/// A webhook call in flight when the server is killed is `uncertain` after the restart; the
/// console settles it (`retry`), after a confirmation, and the turn completes.
async fn resolve_after_sigkill(folder: &Path, store: &str, shots: &str) {
    // The webhook holds its first call (the server is killed while it waits) and answers the
    // next ones at once.
    let calls = Arc::new(AtomicU32::new(0));
    let first_arrived = Arc::new(AtomicBool::new(false));
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    {
        let (calls, first_arrived) = (Arc::clone(&calls), Arc::clone(&first_arrived));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                if common::read_json_request(&mut stream).is_none() {
                    continue;
                }
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    first_arrived.store(true, Ordering::SeqCst);
                    held.push(stream); // never answered
                } else {
                    common::reply_json(
                        &mut stream,
                        &json!({"ok": true, "output": {"charged": true}}),
                    );
                }
            }
        });
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = Server::console_on(folder, &listen, store);
    let base = server.base.clone();
    register(
        &base,
        json!({
            "id": "shop",
            "instructions": "Shop.",
            "model": {"provider": "scripted", "replies": [
                {"toolCalls": [{"name": "run_js", "arguments": {"code": "return await tools.shop.charge({sku: 'a'});"}}]},
                {"text": "Charged."}
            ]},
            "autoConfirm": true,
            "capabilities": [{"kind": "webhook", "id": "shop.charge", "webhookUrl": url,
                "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}}]
        }),
    )
    .await;
    create_session(&base, OPERATOR, "u1", "shop", "ada").await;
    send_message(&base, OPERATOR, "u1", "m1", "Charge it").await;
    let deadline = Instant::now() + PATIENCE;
    while !first_arrived.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the webhook was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9();
    drop(server);
    let server = Server::console_on(folder, &listen, store);
    let base = server.base.clone();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let view = session(&base, OPERATOR, "u1").await;
        if view["status"] == "uncertain" {
            break;
        }
        assert!(Instant::now() < deadline, "never uncertain: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let browser = Browser::start(shots).await;
    browser.sign_in(&base, OPERATOR).await;
    assert!(
        browser.main_text().await.contains("uncertain"),
        "the list shows the uncertain session first-class"
    );
    browser.open_session(&base, "default", "u1").await;
    browser
        .until(
            "the uncertain effect",
            "document.querySelector('.card.uncertain')",
        )
        .await;
    browser.shot("01-uncertain").await;
    browser.press(".card.uncertain", "Retry…").await;
    browser
        .until(
            "the confirmation",
            "document.querySelector('.card.uncertain .warning')",
        )
        .await;
    let warning = browser
        .eval("document.querySelector('.card.uncertain .warning').textContent")
        .await;
    assert!(
        warning
            .as_str()
            .unwrap_or_default()
            .contains("happens twice"),
        "the confirmation says what a retry means: {warning}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "nothing runs before the confirmation"
    );
    browser.shot("02-uncertain-confirm").await;
    browser.press(".card.uncertain", "Confirm: retry").await;
    browser
        .until(
            "the completed turn",
            "document.querySelector('#session-facts .badge')?.textContent === 'completed'",
        )
        .await;
    assert!(browser.main_text().await.contains("effect.resolved"));
    browser.shot("03-uncertain-resolved").await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the retry called the webhook once more"
    );
    let resolved: Vec<Value> = events(&base, OPERATOR, "u1")
        .await
        .into_iter()
        .filter(|e| e["type"] == "effect.resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    assert_eq!(resolved[0]["data"]["decidedBy"], "operator");
    browser.stop().await;
}
