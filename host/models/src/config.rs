//! Provider configuration: which provider, which model, where, and the API key.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

use crate::{AnthropicModel, Model, ModelError, OpenAiModel, ScriptedModel};

/// The default base URL of the OpenAI API (`{base_url}/chat/completions`).
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The default base URL of the Anthropic API (`{base_url}/v1/messages`).
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// An API key. Its `Debug` and `Display` print `[redacted]`, and every error message an adapter
/// builds from a provider's answer has the key replaced by `[redacted]` (some proxies echo it).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// What the key prints as.
    pub const REDACTED: &'static str = "[redacted]";

    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the request header only.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, Self::REDACTED)
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::REDACTED)
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::REDACTED)
    }
}

/// A model provider with a streaming HTTP API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// The OpenAI Chat Completions API, or any server compatible with it.
    OpenAi,
    /// The Anthropic Messages API.
    Anthropic,
}

impl Provider {
    /// The name used in model specs and `describe()`: `openai` or `anthropic`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }

    /// The environment variables read for the API key, first found wins.
    pub fn api_key_vars(self) -> [&'static str; 2] {
        match self {
            Provider::OpenAi => ["CORRAL_OPENAI_API_KEY", "OPENAI_API_KEY"],
            Provider::Anthropic => ["CORRAL_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"],
        }
    }

    /// The environment variable read for the base URL.
    pub fn base_url_var(self) -> &'static str {
        match self {
            Provider::OpenAi => "CORRAL_OPENAI_BASE_URL",
            Provider::Anthropic => "CORRAL_ANTHROPIC_BASE_URL",
        }
    }

    /// The public endpoint used when no base URL is configured.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Provider::OpenAi => OPENAI_DEFAULT_BASE_URL,
            Provider::Anthropic => ANTHROPIC_DEFAULT_BASE_URL,
        }
    }
}

/// Everything needed to build a provider's [`Model`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// Which API.
    pub provider: Provider,
    /// The provider's model name, e.g. `gpt-4o`, `claude-sonnet-4-5`.
    pub model: String,
    /// Where the API lives; `None` means the provider's public endpoint.
    pub base_url: Option<String>,
    /// The API key.
    pub api_key: ApiKey,
}

/// The JSON configuration file: `{"provider": "openai", "model": "gpt-4o"}` with optional
/// `"baseUrl"` and `"apiKeyEnv"` (the variable holding the key; the key itself never goes in a
/// file). Unknown fields are an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProviderConfigFile {
    provider: Provider,
    model: String,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
}

impl ProviderConfig {
    /// Reads the key (`CORRAL_OPENAI_API_KEY`, else `OPENAI_API_KEY`; `CORRAL_ANTHROPIC_API_KEY`,
    /// else `ANTHROPIC_API_KEY`) and the base URL (`CORRAL_OPENAI_BASE_URL`,
    /// `CORRAL_ANTHROPIC_BASE_URL`) from the environment.
    pub fn from_env(provider: Provider, model: impl Into<String>) -> Result<Self, ModelError> {
        Self::from_lookup(provider, model, |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any variable lookup (tests, config layers).
    pub fn from_lookup(
        provider: Provider,
        model: impl Into<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let vars = provider.api_key_vars();
        let api_key = vars
            .iter()
            .find_map(|name| lookup(name).filter(|value| !value.is_empty()))
            .ok_or_else(|| ModelError::Config {
                message: format!(
                    "no API key for {}: set {} or {}",
                    provider.name(),
                    vars[0],
                    vars[1]
                ),
            })?;
        let base_url = lookup(provider.base_url_var()).filter(|value| !value.is_empty());
        Ok(ProviderConfig {
            provider,
            model: model.into(),
            base_url,
            api_key: ApiKey::new(api_key),
        })
    }

    /// Reads a JSON configuration file (see the crate docs); the key comes from the variable
    /// named by `apiKeyEnv`, or else the provider's usual variables; `baseUrl`, when absent,
    /// from the usual base-URL variable.
    pub fn from_json_str(
        json: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let file: ProviderConfigFile =
            serde_json::from_str(json).map_err(|error| ModelError::Config {
                message: format!("invalid provider configuration: {error}"),
            })?;
        let mut config = match &file.api_key_env {
            Some(var) => {
                let key = lookup(var)
                    .filter(|value| !value.is_empty())
                    .ok_or_else(|| ModelError::Config {
                        message: format!(
                            "no API key for {}: {var} is not set",
                            file.provider.name()
                        ),
                    })?;
                ProviderConfig {
                    provider: file.provider,
                    model: file.model.clone(),
                    base_url: lookup(file.provider.base_url_var())
                        .filter(|value| !value.is_empty()),
                    api_key: ApiKey::new(key),
                }
            }
            None => Self::from_lookup(file.provider, file.model.clone(), &lookup)?,
        };
        if file.base_url.is_some() {
            config.base_url = file.base_url;
        }
        Ok(config)
    }

    /// The base URL in use, without a trailing slash.
    pub fn effective_base_url(&self) -> String {
        self.base_url
            .as_deref()
            .unwrap_or(self.provider.default_base_url())
            .trim_end_matches('/')
            .to_owned()
    }

    /// Builds the adapter.
    pub fn build(&self) -> Result<Arc<dyn Model>, ModelError> {
        Ok(match self.provider {
            Provider::OpenAi => Arc::new(OpenAiModel::new(self)?),
            Provider::Anthropic => Arc::new(AnthropicModel::new(self)?),
        })
    }
}

/// Builds a model from a command-line spec: `scripted:FILE.json`, `openai:MODEL` or
/// `anthropic:MODEL` (key and base URL from the environment, see [`ProviderConfig::from_env`]).
pub fn model_from_spec(spec: &str) -> Result<Arc<dyn Model>, ModelError> {
    let (kind, rest) = spec.split_once(':').ok_or_else(|| ModelError::Config {
        message: format!(
            "model spec {spec:?} is not scripted:FILE, openai:MODEL or anthropic:MODEL"
        ),
    })?;
    let provider = match kind {
        "scripted" => return Ok(Arc::new(ScriptedModel::from_file(rest)?)),
        "openai" => Provider::OpenAi,
        "anthropic" => Provider::Anthropic,
        other => {
            return Err(ModelError::Config {
                message: format!(
                    "unknown model provider {other:?} (expected scripted, openai or anthropic)"
                ),
            });
        }
    };
    if rest.is_empty() {
        return Err(ModelError::Config {
            message: format!("model spec {spec:?} names no model"),
        });
    }
    ProviderConfig::from_env(provider, rest)?.build()
}
