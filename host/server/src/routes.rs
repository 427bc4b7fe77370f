//! The route table and its thin handlers: authenticate, extract and validate, call the
//! runtime, answer.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use corral_store::{ActionFilter, ActionStatus, ClaimAction, HeartbeatAction};
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{AppCaller, AppToken, Caller, ExecutorCaller, OperatorCaller};
use crate::error::{ApiError, ErrorBody};
use crate::runtime::{Runtime, action_view};
use crate::sse::{Hub, session_stream, work_stream};
use crate::tenancy::tenant_of;
use crate::wire::{
    Accepted, ActionList, AgentList, AgentPut, AgentView, ClaimRequest, ClaimResponse, Command,
    EraseQuery, EventsQuery, Health, HeartbeatRequest, HeartbeatResponse, ItemsPage, ItemsQuery,
    MAX_SESSION_ID, NoQuery, PutAgent, PutSession, Ready, SessionList, SessionView, SessionsQuery,
    TenantQuery, rfc3339,
};

/// The largest request body accepted (1 MiB).
pub const MAX_BODY: usize = 1024 * 1024;

/// The router's state.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) hub: Arc<Hub>,
}

/// The route table, read like the API reference: each route once, for the router and the
/// OpenAPI document alike (each handler's `#[utoipa::path]` gives its method and path).
pub(crate) fn table() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::base())
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(list_agents))
        .routes(routes!(get_agent, put_agent))
        .routes(routes!(list_sessions))
        .routes(routes!(get_session, put_session, erase_session))
        .routes(routes!(post_command))
        .routes(routes!(get_items))
        .routes(routes!(get_events))
        .routes(routes!(executor_connect))
        .routes(routes!(list_actions))
        .routes(routes!(claim_action))
        .routes(routes!(heartbeat_action))
}

/// Every route as `(METHOD, path)`, read from the document [`table`] builds.
pub fn routes() -> Vec<(String, String)> {
    let document = crate::openapi::document();
    let mut routes = Vec::new();
    for (path, item) in &document.paths.paths {
        let operations = [
            ("GET", item.get.is_some()),
            ("PUT", item.put.is_some()),
            ("POST", item.post.is_some()),
            ("DELETE", item.delete.is_some()),
            ("PATCH", item.patch.is_some()),
        ];
        for (method, present) in operations {
            if present {
                routes.push((method.to_owned(), path.clone()));
            }
        }
    }
    routes
}

/// The router: [`table`] with the fallbacks (404, and 405 with `Allow` for a known path).
/// Around every route: the per-client limits ([`crate::limits`], a route layer that sees
/// the matched route); around everything: the request's span and its `X-Request-Id`
/// ([`crate::logging`]).
pub(crate) fn router(runtime: Arc<Runtime>, hub: Arc<Hub>) -> Router {
    let limits = crate::limits::ClientLimits::new(Arc::clone(&runtime));
    let state = AppState { runtime, hub };
    let (routes, _) = table().split_for_parts();
    routes
        .route_layer(axum::middleware::from_fn_with_state(
            limits,
            crate::limits::limit_requests,
        ))
        .merge(crate::console::router())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(crate::logging::trace_layer())
        .layer(axum::middleware::from_fn(crate::logging::request_id))
        .with_state(state)
}

async fn no_route() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

/// A known path with another method: 405 (the router adds `Allow`).
async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}

/// The caller extractors of [`crate::auth`], over the router's state.
macro_rules! caller_extractor {
    ($($ty:ty),*) => {$(
        impl FromRequestParts<AppState> for $ty {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
                <$ty>::from_request_parts(parts, &state.runtime).await
            }
        }
    )*};
}
caller_extractor!(Caller, AppCaller, AppToken, OperatorCaller, ExecutorCaller);

/// A JSON body of at most [`MAX_BODY`] bytes, parsed into `T` (unknown fields rejected, errors
/// naming the field), with the JSON value it came from.
#[derive(Debug)]
pub struct Body<T> {
    /// The parsed body.
    pub value: T,
    /// The JSON it was parsed from.
    pub raw: Value,
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        let too_large = ApiError::PayloadTooLarge { limit: MAX_BODY };
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large);
        }
        let bytes = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
                while let Some(inner) = source {
                    if inner.is::<http_body_util::LengthLimitError>() {
                        return Err(too_large);
                    }
                    source = inner.source();
                }
                return Err(ApiError::InvalidRequest(
                    "the request body could not be read".to_owned(),
                ));
            }
        };
        let raw: Value = serde_json::from_slice(&bytes)
            .map_err(|error| ApiError::InvalidRequest(format!("invalid JSON: {error}")))?;
        let value = serde_path_to_error::deserialize(&raw).map_err(|error| {
            let path = error.path().to_string();
            if path == "." {
                ApiError::InvalidRequest(format!("invalid request: {}", error.inner()))
            } else {
                ApiError::InvalidRequest(format!("invalid request at {path}: {}", error.inner()))
            }
        })?;
        Ok(Body { value, raw })
    }
}

/// Typed query parameters: `T` names every parameter the route takes (`deny_unknown_fields`),
/// so an unknown or malformed one is a 400, never silently ignored.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|query| Params(query.0))
            .map_err(|rejection| {
                ApiError::InvalidRequest(format!("invalid query: {}", rejection.body_text()))
            })
    }
}

/// A session route's `{id}`: 1 to [`MAX_SESSION_ID`] characters, unique within its tenant.
#[derive(Debug)]
pub struct SessionId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for SessionId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::InvalidRequest(format!("invalid path: {e}")))?;
        let length = id.chars().count();
        if length == 0 || length > MAX_SESSION_ID {
            return Err(ApiError::InvalidRequest(format!(
                "the session id must have 1 to {MAX_SESSION_ID} characters"
            )));
        }
        Ok(SessionId(id))
    }
}

/// An action route's `{id}`.
#[derive(Debug)]
pub struct ActionId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ActionId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::InvalidRequest(format!("invalid path: {e}")))?;
        Ok(ActionId(id))
    }
}

/// Liveness
///
/// Whether the process is up (no token needed).
#[utoipa::path(get, path = "/health", tag = "health",
    params(NoQuery),
    responses(
        (status = 200, description = "The process is up", body = Health, example = json!({"status": "ok"})),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody)))]
pub(crate) async fn health(Params(NoQuery {}): Params<NoQuery>) -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// Readiness
///
/// Whether the store and the scheduler are ready and the server accepts work (no token needed).
#[utoipa::path(get, path = "/ready", tag = "health",
    params(NoQuery),
    responses(
        (status = 200, description = "Store and scheduler are ready", body = Ready,
            example = json!({"status": "ready", "checks": {"accepting": true, "scheduler": true, "store": true}})),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 503, description = "Not ready, or shutting down", body = Ready)))]
pub(crate) async fn ready(
    State(state): State<AppState>,
    Params(NoQuery {}): Params<NoQuery>,
) -> Response {
    let checks = state.runtime.readiness().await;
    let ok = checks.iter().all(|(_, ok)| *ok);
    let body = Ready {
        status: if ok { "ready" } else { "not_ready" }.to_owned(),
        checks: checks.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Prometheus metrics
///
/// Prometheus text: commands, turns, effects, streams, store latency (operator token).
#[utoipa::path(get, path = "/metrics", tag = "health", security(("bearer" = [])),
    params(NoQuery),
    responses(
        (status = 200, description = "Prometheus text", content_type = "text/plain", body = String),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an operator token", body = ErrorBody)))]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    _caller: OperatorCaller,
    Params(NoQuery {}): Params<NoQuery>,
) -> Result<Response, ApiError> {
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::scrape(&state.runtime).await,
    )
        .into_response())
}

/// This OpenAPI document
///
/// This description (OpenAPI 3.1), generated from the handlers' own types (no token needed).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "health",
    params(NoQuery),
    responses(
        (status = 200, description = "This description (OpenAPI 3.1)", body = Object),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody)))]
pub(crate) async fn openapi(Params(NoQuery {}): Params<NoQuery>) -> Response {
    (
        [(CONTENT_TYPE, "application/json")],
        crate::openapi::document_json(),
    )
        .into_response()
}

/// List agents
///
/// The agents the token may see, by id: every agent for an operator token; for a tenant token
/// its tenant's and those shared with it (without `sharedWith`).
#[utoipa::path(get, path = "/v1/agents", tag = "agents", security(("bearer" = [])),
    params(NoQuery),
    responses(
        (status = 200, description = "Every agent", body = AgentList),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_agents(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    Params(NoQuery {}): Params<NoQuery>,
) -> Result<Json<AgentList>, ApiError> {
    Ok(Json(AgentList {
        agents: state.runtime.list_agents(tenant.as_deref()).await?,
    }))
}

/// Get an agent
///
/// One registered agent: its manifest, hash and implementation version (404 for an agent a
/// tenant token may not see).
#[utoipa::path(get, path = "/v1/agents/{agentId}", tag = "agents", security(("bearer" = [])),
    params(("agentId" = String, Path, description = "The agent id"), NoQuery),
    responses(
        (status = 200, description = "The agent", body = AgentView),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 404, description = "No such agent", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_agent(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    ActionId(agent_id): ActionId,
    Params(NoQuery {}): Params<NoQuery>,
) -> Result<Json<AgentView>, ApiError> {
    state
        .runtime
        .list_agents(tenant.as_deref())
        .await?
        .into_iter()
        .find(|agent| agent.agent_id == agent_id)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("agent {agent_id:?} not found")))
}

/// Register an agent
///
/// Registers an agent, or replaces its manifest: an operator's own (shared with the tenants in
/// `sharedWith`) or one owned by a tenant (`tenantId`); a tenant token granted
/// `canRegisterAgents` registers agents owned by its tenant. The manifest's `id` must equal the
/// path and the manifest must pass its checks (capability kinds, unique ids and schemas, limits
/// within their ranges, a model provider whose key the server has, MCP server definitions, and
/// with `checkMcpServers` MCP servers that start and list their tools): 400 otherwise, naming
/// the field.
#[utoipa::path(put, path = "/v1/agents/{agentId}", tag = "agents", security(("bearer" = [])),
    params(("agentId" = String, Path, description = "The agent id; equal to the manifest's id"), NoQuery),
    request_body(content = PutAgent, example = json!({"manifest": {"id": "demo", "instructions": "Help.",
        "model": {"provider": "scripted", "replies": [{"text": "hi"}]},
        "capabilities": [{"kind": "builtin", "id": "examples.echo"}]}, "implementationVersion": "1",
        "sharedWith": ["acme"]})),
    responses(
        (status = 200, description = "Registered", body = AgentPut),
        (status = 400, description = "Bad JSON, unknown field, schema violation, invalid manifest (limits out of range, duplicate capability ids, a provider without a key, an MCP server that cannot start), id mismatch, an invalid tenant name, tenantId with sharedWith, a query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token; a tenant token not granted canRegisterAgents, naming another tenant or sharing", body = ErrorBody),
        (status = 409, description = "A tenant token registering an id another tenant or the operator holds", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn put_agent(
    State(state): State<AppState>,
    AppToken(caller): AppToken,
    ActionId(agent_id): ActionId,
    Params(NoQuery {}): Params<NoQuery>,
    body: Body<PutAgent>,
) -> Result<Json<AgentPut>, ApiError> {
    let raw_manifest = body.raw.get("manifest").cloned().unwrap_or(Value::Null);
    Ok(Json(
        state
            .runtime
            .put_agent(&caller, &agent_id, &body.value, raw_manifest)
            .await?,
    ))
}

/// List sessions
///
/// A page of the sessions the token may see: a tenant token its tenant's, an operator token
/// every tenant's unless it names one; filtered by agent, owner and status, with counts by
/// status (over the other filters). Keyset paging: pass `next` as `after`.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    params(SessionsQuery),
    responses(
        (status = 200, description = "Sessions the token may see", body = SessionList),
        (status = 400, description = "An unknown query parameter, or an invalid tenantId", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    Params(query): Params<SessionsQuery>,
) -> Result<Json<SessionList>, ApiError> {
    Ok(Json(
        state
            .runtime
            .list_sessions(tenant.as_deref(), query)
            .await?,
    ))
}

/// Create a session
///
/// Creates a session idempotently: the same creation parameters again return it; other ones
/// are 409.
#[utoipa::path(put, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        TenantQuery),
    request_body(content = PutSession,
        example = json!({"agentId": "demo", "ownerUserId": "ada", "info": {"displayName": "Ada"}})),
    responses(
        (status = 200, description = "The session (created now or before with equal parameters)", body = SessionView),
        (status = 400, description = "Bad JSON, unknown field, schema violation, tenantId query and field disagree, an unknown query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown agent", body = ErrorBody),
        (status = 409, description = "Exists with other creation parameters", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn put_session(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    SessionId(id): SessionId,
    Params(query): Params<TenantQuery>,
    body: Body<PutSession>,
) -> Result<Json<SessionView>, ApiError> {
    let (tenant, asked) = (tenant.as_deref(), query.tenant_id.as_deref());
    Ok(Json(
        state
            .runtime
            .put_session(tenant, asked, &id, body.value)
            .await?,
    ))
}

/// The addressed session, if the caller may see it (its store key is `id`).
async fn visible(
    state: &AppState,
    tenant: Option<String>,
    asked: Option<&str>,
    id: &str,
) -> Result<corral_store::Session, ApiError> {
    state
        .runtime
        .visible_session(tenant.as_deref(), asked, id)
        .await
}

/// Get a session
///
/// The session: status, what its turn waits on, its last error, open actions and uncertain
/// effects.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        TenantQuery),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 400, description = "An unknown query parameter, an invalid tenantId or id", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    SessionId(id): SessionId,
    Params(query): Params<TenantQuery>,
) -> Result<Json<SessionView>, ApiError> {
    let session = visible(&state, tenant, query.tenant_id.as_deref(), &id).await?;
    Ok(Json(state.runtime.view(session).await?))
}

/// Erase a session
///
/// Erases the session and everything stored for it: events, items, checkpoints, effects,
/// actions and idempotency records (a user's data), as an operator or the owning tenant. A
/// session whose turn is in progress (running, paused, waiting, uncertain) is 409 unless
/// `cancel=true`. The erasure is logged (target `corral::operator`) with the token's name.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        EraseQuery),
    responses(
        (status = 204, description = "Erased"),
        (status = 400, description = "An unknown query parameter, an invalid tenantId or id", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 409, description = "A turn is in progress and cancel is not true", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn erase_session(
    State(state): State<AppState>,
    AppToken(caller): AppToken,
    SessionId(id): SessionId,
    Params(query): Params<EraseQuery>,
) -> Result<StatusCode, ApiError> {
    state
        .runtime
        .erase_session(
            &caller,
            query.tenant_id.as_deref(),
            &id,
            query.cancel.unwrap_or(false),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a command
///
/// Runs one command, idempotent by its `idempotencyKey`: `message`, `approve`, `respond`,
/// `cancel` (application tokens), `action_result` (executor tokens), `resolve` (operator).
/// `resolve` takes exactly one of `"retry": true` and `outcome` (400 otherwise).
#[utoipa::path(post, path = "/v1/sessions/{id}/commands", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        TenantQuery),
    request_body(content = Command, examples(
        ("message" = (summary = "Start a turn", value = json!({"type": "message", "idempotencyKey": "m1", "content": "Run two sleeps at once"}))),
        ("approve" = (summary = "Approve a paused call", value = json!({"type": "approve", "idempotencyKey": "a1", "interactionId": "94c42fd9-c38a-4dfd-87b2-541780f10a71:s0:t0", "approved": true}))),
        ("respond" = (summary = "Answer an input request", value = json!({"type": "respond", "idempotencyKey": "r1", "interactionId": "94c42fd9-c38a-4dfd-87b2-541780f10a71:s0:t1", "value": {"city": "Paris"}}))),
        ("cancel" = (summary = "Cancel the turn", value = json!({"type": "cancel", "idempotencyKey": "c1", "reason": "changed my mind"}))),
        ("action_result" = (summary = "Report an action's outcome", value = json!({"type": "action_result", "idempotencyKey": "x1", "actionId": "94c42fd9-c38a-4dfd-87b2-541780f10a71:s0:t0:c0", "claimId": "6a1f0e52-3f0e-4a6b-9c55-0b1f0e7d9a11", "generation": 1, "outcome": {"value": {"done": true}}}))),
        ("resolve" = (summary = "Retry an uncertain effect", value = json!({"type": "resolve", "idempotencyKey": "v1", "effectId": "94c42fd9-c38a-4dfd-87b2-541780f10a71:s0:t0:c0", "retry": true}))),
    )),
    responses(
        (status = 200, description = "Accepted (a replay returns the first response byte for byte)", body = Accepted,
            example = json!({"status": "accepted", "turnId": "94c42fd9-c38a-4dfd-87b2-541780f10a71", "cursor": 1, "requestId": null})),
        (status = 400, description = "Bad JSON, unknown field, schema violation, resolve without exactly one of retry and outcome, an unknown query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token for a non-executor command, an action outside its scope, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown session (or another tenant's), action or effect", body = ErrorBody),
        (status = 409, description = "Status rule, stale claim, or key bound to another command", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 429, description = "The addressed tenant is over its command rate (`[limits]` commandsPerSecond and commandBurst); retry after `Retry-After` seconds", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until the tenant's next command is accepted"))),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn post_command(
    State(state): State<AppState>,
    caller: Caller,
    SessionId(id): SessionId,
    Params(query): Params<TenantQuery>,
    body: Body<Command>,
) -> Result<Json<Value>, ApiError> {
    let asked = query.tenant_id.as_deref();
    Ok(Json(
        state
            .runtime
            .command(&caller, asked, &id, body.value, body.raw)
            .await?,
    ))
}

/// Page the event history
///
/// A page of the session's events after `cursor`, oldest first.
#[utoipa::path(get, path = "/v1/sessions/{id}/items", tag = "events", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        ItemsQuery),
    responses(
        (status = 200, description = "A page of events", body = ItemsPage),
        (status = 400, description = "Bad cursor (beyond the newest event) or limit, an unknown query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_items(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    SessionId(id): SessionId,
    Params(query): Params<ItemsQuery>,
) -> Result<Json<ItemsPage>, ApiError> {
    let limit = match query.limit {
        None => 100,
        Some(n) if (1..=corral_store::MAX_PAGE).contains(&(n as usize)) => n as usize,
        Some(n) => {
            return Err(ApiError::InvalidRequest(format!(
                "invalid limit {n}: 1 to {}",
                corral_store::MAX_PAGE
            )));
        }
    };
    let session = visible(&state, tenant, query.tenant_id.as_deref(), &id).await?;
    let cursor = query.cursor.unwrap_or(0);
    let items = state
        .runtime
        .events_after(&session.id, cursor, limit)
        .await?;
    let next = items.last().map_or(cursor, |e| e.cursor);
    Ok(Json(ItemsPage {
        items,
        cursor: next,
    }))
}

fn cursor_of(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().map_err(|_| {
        ApiError::InvalidRequest(format!(
            "invalid cursor {text:?}: a cursor is a non-negative integer"
        ))
    })
}

/// Stream events (SSE)
///
/// The session's events as server-sent events: the history after the cursor, then live.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "events", security(("bearer" = [])),
    params(("id" = String, Path, min_length = 1, max_length = 200, description = "The session id within its tenant (1 to 200 characters)"),
        EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this cursor")),
    responses(
        (status = 200, description = "Server-sent events: `id: CURSOR`, `event: TYPE`, `data: EVENT`", content_type = "text/event-stream", body = crate::wire::EventView),
        (status = 400, description = "Bad cursor (beyond the newest event), an unknown query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or another tenant from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 429, description = "The token already has `sseStreamsPerToken` open streams", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_events(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    SessionId(id): SessionId,
    Params(query): Params<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = visible(&state, tenant, query.tenant_id.as_deref(), &id).await?;
    let cursor = match query.cursor {
        Some(cursor) => cursor,
        None => match headers.get("last-event-id") {
            Some(value) => cursor_of(value.to_str().unwrap_or("?"))?,
            None => 0,
        },
    };
    if cursor > session.last_cursor {
        return Err(ApiError::InvalidRequest(format!(
            "invalid cursor {cursor}: beyond the newest event {}",
            session.last_cursor
        )));
    }
    Ok(session_stream(&state.runtime, &state.hub, session.id, cursor).into_response())
}

/// Executor work stream (SSE)
///
/// Server-sent `work_available` events for an executor (executor tokens).
#[utoipa::path(get, path = "/v1/executors/connect", tag = "executors", security(("bearer" = [])),
    params(NoQuery),
    responses(
        (status = 200, description = "Server-sent `work_available` events", content_type = "text/event-stream", body = String),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token", body = ErrorBody),
        (status = 429, description = "The token already has `sseStreamsPerToken` open streams", body = ErrorBody)))]
pub(crate) async fn executor_connect(
    State(state): State<AppState>,
    _caller: ExecutorCaller,
    Params(NoQuery {}): Params<NoQuery>,
) -> Result<Response, ApiError> {
    Ok(work_stream(&state.runtime, &state.hub).into_response())
}

/// List pending actions
///
/// The pending actions in the executor token's scope.
#[utoipa::path(get, path = "/v1/actions", tag = "executors", security(("bearer" = [])),
    params(NoQuery),
    responses(
        (status = 200, description = "Pending actions in the token's scope", body = ActionList),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_actions(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
    Params(NoQuery {}): Params<NoQuery>,
) -> Result<Json<ActionList>, ApiError> {
    let mut filter = ActionFilter::default();
    filter.statuses = vec![ActionStatus::Pending];
    filter.scope = Some(scope.clone());
    let actions = state
        .runtime
        .store
        .list_actions(&filter)
        .await
        .map_err(|e| ApiError::from_store("list actions", e))?;
    Ok(Json(ActionList {
        actions: actions
            .into_iter()
            .filter(|action| scope.covers_tenant(tenant_of(&action.session_id)))
            .map(action_view)
            .collect(),
    }))
}

/// The action, if the executor's scope covers it (404 unknown, 403 outside the scope).
async fn scoped_action(
    state: &AppState,
    scope: &corral_store::ExecutorScope,
    action_id: &str,
) -> Result<corral_store::Action, ApiError> {
    let action = state
        .runtime
        .store
        .get_action(action_id)
        .await
        .map_err(|e| ApiError::from_store("get action", e))?;
    if !scope.covers(&action, tenant_of(&action.session_id)) {
        return Err(ApiError::Forbidden(
            "the action is outside the executor token's scope".to_owned(),
        ));
    }
    Ok(action)
}

/// Claim an action
///
/// Claims a pending action for a lease, presenting the definition the executor runs.
#[utoipa::path(post, path = "/v1/actions/{id}/claim", tag = "executors", security(("bearer" = [])),
    params(("id" = String, Path, description = "The action id"), NoQuery),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "Claimed", body = ClaimResponse),
        (status = 400, description = "Bad JSON, unknown field, schema violation, a query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token, or outside its scope", body = ErrorBody),
        (status = 404, description = "Unknown action", body = ErrorBody),
        (status = 409, description = "Definition mismatch, or the action is not available", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn claim_action(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
    ActionId(id): ActionId,
    Params(NoQuery {}): Params<NoQuery>,
    body: Body<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    scoped_action(&state, &scope, &id).await?;
    let claim_id = uuid::Uuid::new_v4().to_string();
    let claimed = state
        .runtime
        .store
        .claim_action(ClaimAction::new(
            &id,
            &claim_id,
            state.runtime.config().lease,
            &body.value.manifest_hash,
            &body.value.implementation_version,
        ))
        .await
        .map_err(|e| ApiError::from_store("claim action", e))?;
    let action = claimed.action;
    let lease = action.lease_expires_at.map(rfc3339).unwrap_or_default();
    Ok(Json(ClaimResponse {
        claim_id,
        generation: action.generation,
        lease_expires_at: lease,
        action: action_view(action),
    }))
}

/// Heartbeat a claim
///
/// Extends a claim's lease.
#[utoipa::path(post, path = "/v1/actions/{id}/heartbeat", tag = "executors", security(("bearer" = [])),
    params(("id" = String, Path, description = "The action id"), NoQuery),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "Lease extended", body = HeartbeatResponse),
        (status = 400, description = "Bad JSON, unknown field, schema violation, a query parameter", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token, or outside its scope", body = ErrorBody),
        (status = 404, description = "Unknown action", body = ErrorBody),
        (status = 409, description = "Stale, expired or superseded claim, or the turn is over", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn heartbeat_action(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
    ActionId(id): ActionId,
    Params(NoQuery {}): Params<NoQuery>,
    body: Body<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let action = scoped_action(&state, &scope, &id).await?;
    let session = state
        .runtime
        .store
        .get_session(&action.session_id)
        .await
        .map_err(|e| ApiError::from_store("get session", e))?;
    if session.status == corral_store::SessionStatus::Cancelled
        || session.active_turn_id.as_deref() != Some(action.turn_id.as_str())
    {
        return Err(ApiError::Conflict(
            "the action's turn is no longer active".to_owned(),
        ));
    }
    let action = state
        .runtime
        .store
        .heartbeat_action(HeartbeatAction::new(
            &id,
            &body.value.claim_id,
            body.value.generation,
            state.runtime.config().lease,
        ))
        .await
        .map_err(|e| ApiError::from_store("heartbeat action", e))?;
    Ok(Json(HeartbeatResponse {
        lease_expires_at: action.lease_expires_at.map(rfc3339).unwrap_or_default(),
    }))
}
