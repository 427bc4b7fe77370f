//! The few WebDriver commands the console's browser test needs, over `reqwest` (W3C WebDriver,
//! spoken by Debian's chromedriver).
//!
//! Why not a WebDriver crate: `fantoccini` (through the `webdriver` crate) turns on features of
//! dependencies the `corral` binary shares (`syn`, `fnv`, ICU's `zerofrom`), so `scripts/run`
//! would rebuild wasmtime after `scripts/test`, which `check_feature_sets` refuses; these
//! commands are plain JSON over HTTP.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

/// The key WebDriver names elements by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// WebDriver's code for the Tab key.
pub const TAB: char = '\u{E004}';
/// WebDriver's code for the Enter key.
pub const ENTER: char = '\u{E007}';

/// One browser session.
#[derive(Debug)]
pub struct Session {
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`.
    url: String,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Session {
    /// Opens a session on the WebDriver server at `driver` with these capabilities.
    pub async fn start(driver: &str, capabilities: Value) -> Result<Session, String> {
        let http = reqwest::Client::new();
        let answer = send(
            &http,
            reqwest::Method::POST,
            &format!("{driver}/session"),
            Some(json!({"capabilities": {"alwaysMatch": capabilities}})),
        )
        .await?;
        let id = answer["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session id in {answer}"))?;
        Ok(Session {
            http,
            url: format!("{driver}/session/{id}"),
        })
    }

    async fn command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        send(&self.http, method, &format!("{}{path}", self.url), body).await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    /// Navigates to `url`.
    pub async fn goto(&self, url: &str) -> Result<(), String> {
        self.post("/url", json!({"url": url})).await.map(drop)
    }

    /// The page's URL.
    pub async fn current_url(&self) -> Result<String, String> {
        let value = self.command(reqwest::Method::GET, "/url", None).await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub async fn execute(&self, script: &str) -> Result<Value, String> {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// The first element matching the CSS `selector`.
    pub async fn find(&self, selector: &str) -> Result<Element, String> {
        let value = self
            .post(
                "/element",
                json!({"using": "css selector", "value": selector}),
            )
            .await?;
        element(&value)
    }

    /// Every element matching the CSS `selector`.
    pub async fn find_all(&self, selector: &str) -> Result<Vec<Element>, String> {
        let value = self
            .post(
                "/elements",
                json!({"using": "css selector", "value": selector}),
            )
            .await?;
        value
            .as_array()
            .map(|all| all.iter().map(element).collect())
            .unwrap_or_else(|| Ok(Vec::new()))
    }

    /// Clicks `element` (as a person would: scrolled into view, at its centre).
    pub async fn click(&self, element: &Element) -> Result<(), String> {
        self.post(&format!("/element/{}/click", element.0), json!({}))
            .await
            .map(drop)
    }

    /// The rendered text of `element`.
    pub async fn text(&self, element: &Element) -> Result<String, String> {
        let value = self
            .command(
                reqwest::Method::GET,
                &format!("/element/{}/text", element.0),
                None,
            )
            .await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// Empties a text field.
    pub async fn clear(&self, element: &Element) -> Result<(), String> {
        self.post(&format!("/element/{}/clear", element.0), json!({}))
            .await
            .map(drop)
    }

    /// Types `text` into `element`.
    pub async fn type_text(&self, element: &Element, text: &str) -> Result<(), String> {
        self.post(
            &format!("/element/{}/value", element.0),
            json!({"text": text}),
        )
        .await
        .map(drop)
    }

    /// Presses and releases `key` on whatever has the focus (the keyboard, not an element).
    pub async fn press_key(&self, key: char) -> Result<(), String> {
        let key = key.to_string();
        self.post(
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
                {"type": "keyDown", "value": key}, {"type": "keyUp", "value": key}
            ]}]}),
        )
        .await
        .map(drop)
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Result<Vec<u8>, String> {
        let value = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await?;
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .map_err(|e| format!("screenshot: {e}"))
    }

    /// Ends the session (closes the browser).
    pub async fn close(&self) -> Result<(), String> {
        self.command(reqwest::Method::DELETE, "", None)
            .await
            .map(drop)
    }
}

fn element(value: &Value) -> Result<Element, String> {
    value[ELEMENT]
        .as_str()
        .map(|id| Element(id.to_owned()))
        .ok_or_else(|| format!("not an element: {value}"))
}

/// One WebDriver request: its `value`, or the error WebDriver answered.
async fn send(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let mut request = http.request(method, url).timeout(Duration::from_secs(60));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .map_err(|e| format!("{url}: not JSON: {e}"))?;
    if !status.is_success() {
        return Err(format!("{url}: {status}: {}", answer["value"]));
    }
    Ok(answer["value"].clone())
}
