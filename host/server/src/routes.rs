//! The route table and its thin handlers: authenticate, extract and validate, call the
//! runtime, answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use corral_store::{ActionFilter, ActionStatus, ClaimAction, HeartbeatAction};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::auth::{AppCaller, Caller, ExecutorCaller, OperatorCaller};
use crate::error::{ApiError, ErrorBody};
use crate::manifest::Manifest;
use crate::runtime::{Runtime, action_view};
use crate::sse::{Hub, session_stream, work_stream};
use crate::wire::{
    Accepted, ActionList, AgentList, AgentPut, ClaimRequest, ClaimResponse, Command, Health,
    HeartbeatRequest, HeartbeatResponse, ItemsPage, PutAgent, PutSession, Ready, SessionList,
    SessionView, rfc3339,
};

/// The largest request body accepted (1 MiB).
pub const MAX_BODY: usize = 1024 * 1024;

/// Every route: method and path, as in the OpenAPI description.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/metrics"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/agents"),
    ("PUT", "/v1/agents/{agentId}"),
    ("GET", "/v1/sessions"),
    ("PUT", "/v1/sessions/{id}"),
    ("GET", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/commands"),
    ("GET", "/v1/sessions/{id}/items"),
    ("GET", "/v1/sessions/{id}/events"),
    ("GET", "/v1/executors/connect"),
    ("GET", "/v1/actions"),
    ("POST", "/v1/actions/{id}/claim"),
    ("POST", "/v1/actions/{id}/heartbeat"),
];

/// The router's state.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) hub: Arc<Hub>,
}

/// The route table.
pub(crate) fn router(runtime: Arc<Runtime>, hub: Arc<Hub>) -> Router {
    let state = AppState { runtime, hub };
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/agents", get(list_agents))
        .route("/v1/agents/{agent_id}", axum::routing::put(put_agent))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).put(put_session))
        .route("/v1/sessions/{id}/commands", post(post_command))
        .route("/v1/sessions/{id}/items", get(get_items))
        .route("/v1/sessions/{id}/events", get(get_events))
        .route("/v1/executors/connect", get(executor_connect))
        .route("/v1/actions", get(list_actions))
        .route("/v1/actions/{id}/claim", post(claim_action))
        .route("/v1/actions/{id}/heartbeat", post(heartbeat_action))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

async fn no_route() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
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
caller_extractor!(Caller, AppCaller, OperatorCaller, ExecutorCaller);

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

/// Query parameters as text, checked by the handler.
#[derive(Debug, Default)]
pub struct QueryMap(pub BTreeMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let map = axum::extract::Query::<BTreeMap<String, String>>::from_request_parts(parts, &())
            .await
            .map_err(|e| ApiError::InvalidRequest(format!("invalid query: {e}")))?;
        Ok(QueryMap(map.0))
    }
}

/// A session route's `{id}` and optional `tenantId` query parameter (an operator's choice of
/// tenant; see [`crate::tenancy`]).
#[derive(Debug)]
pub struct SessionAddress {
    /// The id within the tenant.
    pub id: String,
    /// The tenant asked for.
    pub tenant: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for SessionAddress {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::InvalidRequest(format!("invalid path: {e}")))?;
        let QueryMap(mut query) = QueryMap::from_request_parts(parts, state).await?;
        Ok(SessionAddress {
            id,
            tenant: query.remove("tenantId"),
        })
    }
}

fn cursor_of(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().map_err(|_| {
        ApiError::InvalidRequest(format!(
            "invalid cursor {text:?}: a cursor is a non-negative integer"
        ))
    })
}

#[utoipa::path(get, path = "/health", tag = "health",
    responses((status = 200, description = "The process is up", body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

#[utoipa::path(get, path = "/ready", tag = "health",
    responses(
        (status = 200, description = "Store and scheduler are ready", body = Ready),
        (status = 503, description = "Not ready, or shutting down", body = Ready)))]
pub(crate) async fn ready(State(state): State<AppState>) -> Response {
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

#[utoipa::path(get, path = "/metrics", tag = "health", security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text", content_type = "text/plain", body = String),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an operator token", body = ErrorBody)))]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    _caller: OperatorCaller,
) -> Result<Response, ApiError> {
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.runtime.metrics.render(),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "health",
    responses((status = 200, description = "This description (OpenAPI 3.1)", body = Object)))]
pub(crate) async fn openapi() -> Response {
    (
        [(CONTENT_TYPE, "application/json")],
        crate::openapi::document_json(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/v1/agents", tag = "agents", security(("bearer" = [])),
    responses(
        (status = 200, description = "Every agent", body = AgentList),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_agents(
    State(state): State<AppState>,
    _caller: AppCaller,
) -> Result<Json<AgentList>, ApiError> {
    Ok(Json(AgentList {
        agents: state.runtime.list_agents().await?,
    }))
}

#[utoipa::path(put, path = "/v1/agents/{agentId}", tag = "agents", security(("bearer" = [])),
    params(("agentId" = String, Path, description = "The agent id; equal to the manifest's id")),
    request_body = PutAgent,
    responses(
        (status = 200, description = "Registered", body = AgentPut),
        (status = 400, description = "Bad JSON, unknown field, invalid manifest, id mismatch", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor or tenant token", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn put_agent(
    State(state): State<AppState>,
    _caller: OperatorCaller,
    Path(agent_id): Path<String>,
    body: Body<PutAgent>,
) -> Result<Json<AgentPut>, ApiError> {
    let raw_manifest = body.raw.get("manifest").cloned().unwrap_or(Value::Null);
    let manifest: &Manifest = &body.value.manifest;
    Ok(Json(
        state
            .runtime
            .put_agent(
                &agent_id,
                manifest,
                raw_manifest,
                &body.value.implementation_version,
            )
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    params(("agentId" = Option<String>, Query, description = "Only this agent's sessions"),
        ("tenantId" = Option<String>, Query, description = "Only this tenant's (an operator token sees every tenant's without it)")),
    responses(
        (status = 200, description = "Sessions the token may see", body = SessionList),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    QueryMap(query): QueryMap,
) -> Result<Json<SessionList>, ApiError> {
    let tenant = tenant.as_deref();
    let asked = query.get("tenantId").map(String::as_str);
    let agent = query.get("agentId").cloned();
    Ok(Json(SessionList {
        sessions: state.runtime.list_sessions(tenant, asked, agent).await?,
    }))
}

#[utoipa::path(put, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, description = "The session id within its tenant"),
        ("tenantId" = Option<String>, Query, description = "An operator token's tenant (default: `default`); a tenant token may only name its own")),
    request_body = PutSession,
    responses(
        (status = 200, description = "The session (created now or before with equal parameters)", body = SessionView),
        (status = 400, description = "Bad JSON, unknown field, schema violation", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token, or tenantId from a tenant token", body = ErrorBody),
        (status = 404, description = "Unknown agent", body = ErrorBody),
        (status = 409, description = "Exists with other creation parameters", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn put_session(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    address: SessionAddress,
    body: Body<PutSession>,
) -> Result<Json<SessionView>, ApiError> {
    let (tenant, asked) = (tenant.as_deref(), address.tenant.as_deref());
    Ok(Json(
        state
            .runtime
            .put_session(tenant, asked, &address.id, body.value)
            .await?,
    ))
}

/// The addressed session, if the caller may see it (its store key is `id`).
async fn visible(
    state: &AppState,
    tenant: Option<String>,
    address: &SessionAddress,
) -> Result<corral_store::Session, ApiError> {
    let asked = address.tenant.as_deref();
    state
        .runtime
        .visible_session(tenant.as_deref(), asked, &address.id)
        .await
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, description = "The session id within its tenant"),
        ("tenantId" = Option<String>, Query, description = "An operator token's tenant (default: `default`); a tenant token may only name its own")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    address: SessionAddress,
) -> Result<Json<SessionView>, ApiError> {
    let session = visible(&state, tenant, &address).await?;
    Ok(Json(state.runtime.view(session).await?))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/commands", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, description = "The session id within its tenant"),
        ("tenantId" = Option<String>, Query, description = "An operator token's tenant (default: `default`); a tenant token may only name its own")),
    request_body = Command,
    responses(
        (status = 200, description = "Accepted (a replay returns the first response byte for byte)", body = Accepted),
        (status = 400, description = "Bad JSON, unknown field, schema violation", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token for a non-executor command, or an action outside its scope", body = ErrorBody),
        (status = 404, description = "Unknown session (or another tenant's), action or effect", body = ErrorBody),
        (status = 409, description = "Status rule, stale claim, or key bound to another command", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn post_command(
    State(state): State<AppState>,
    caller: Caller,
    address: SessionAddress,
    body: Body<Command>,
) -> Result<Json<Value>, ApiError> {
    let asked = address.tenant.as_deref();
    Ok(Json(
        state
            .runtime
            .command(&caller, asked, &address.id, body.value, body.raw)
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/items", tag = "events", security(("bearer" = [])),
    params(
        ("id" = String, Path, description = "The session id within its tenant"),
        ("tenantId" = Option<String>, Query, description = "An operator token's tenant (default: `default`); a tenant token may only name its own"),
        ("cursor" = Option<u64>, Query, description = "Events after this cursor (0: from the start)"),
        ("limit" = Option<usize>, Query, description = "1..=1000, 100 by default")),
    responses(
        (status = 200, description = "A page of events", body = ItemsPage),
        (status = 400, description = "Bad cursor or limit", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_items(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    address: SessionAddress,
    QueryMap(query): QueryMap,
) -> Result<Json<ItemsPage>, ApiError> {
    let session = visible(&state, tenant, &address).await?;
    let cursor = query
        .get("cursor")
        .map(|c| cursor_of(c))
        .transpose()?
        .unwrap_or(0);
    let limit = match query.get("limit") {
        None => 100,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=corral_store::MAX_PAGE).contains(n))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!("invalid limit {text:?}: 1 to 1000"))
            })?,
    };
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

#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "events", security(("bearer" = [])),
    params(
        ("id" = String, Path, description = "The session id within its tenant"),
        ("tenantId" = Option<String>, Query, description = "An operator token's tenant (default: `default`); a tenant token may only name its own"),
        ("cursor" = Option<u64>, Query, description = "Resume after this cursor (else Last-Event-ID, else 0)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this cursor")),
    responses(
        (status = 200, description = "Server-sent events: `id: CURSOR`, `event: TYPE`, `data: EVENT`", content_type = "text/event-stream", body = crate::wire::EventView),
        (status = 400, description = "Bad cursor", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Executor token", body = ErrorBody),
        (status = 404, description = "Unknown, or another tenant's", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn get_events(
    State(state): State<AppState>,
    AppCaller(tenant): AppCaller,
    address: SessionAddress,
    headers: HeaderMap,
    QueryMap(query): QueryMap,
) -> Result<Response, ApiError> {
    let session = visible(&state, tenant, &address).await?;
    let cursor = match query.get("cursor") {
        Some(text) => cursor_of(text)?,
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

#[utoipa::path(get, path = "/v1/executors/connect", tag = "executors", security(("bearer" = [])),
    responses(
        (status = 200, description = "Server-sent `work_available` events", content_type = "text/event-stream", body = String),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token", body = ErrorBody)))]
pub(crate) async fn executor_connect(
    State(state): State<AppState>,
    _caller: ExecutorCaller,
) -> Result<Response, ApiError> {
    Ok(work_stream(&state.runtime, &state.hub).into_response())
}

#[utoipa::path(get, path = "/v1/actions", tag = "executors", security(("bearer" = [])),
    responses(
        (status = 200, description = "Pending actions in the token's scope", body = ActionList),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn list_actions(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
) -> Result<Json<ActionList>, ApiError> {
    let mut filter = ActionFilter::default();
    filter.statuses = vec![ActionStatus::Pending];
    filter.scope = Some(scope);
    let actions = state
        .runtime
        .store
        .list_actions(&filter)
        .await
        .map_err(|e| ApiError::from_store("list actions", e))?;
    Ok(Json(ActionList {
        actions: actions.into_iter().map(action_view).collect(),
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
    if action.agent_id != scope.agent_id
        || action.manifest_hash != scope.manifest_hash
        || action.implementation_version != scope.implementation_version
    {
        return Err(ApiError::Forbidden(
            "the action is outside the executor token's scope".to_owned(),
        ));
    }
    Ok(action)
}

#[utoipa::path(post, path = "/v1/actions/{id}/claim", tag = "executors", security(("bearer" = [])),
    params(("id" = String, Path, description = "The action id")),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "Claimed", body = ClaimResponse),
        (status = 400, description = "Bad JSON, unknown field", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token, or outside its scope", body = ErrorBody),
        (status = 404, description = "Unknown action", body = ErrorBody),
        (status = 409, description = "Definition mismatch, or the action is not available", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn claim_action(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
    Path(id): Path<String>,
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

#[utoipa::path(post, path = "/v1/actions/{id}/heartbeat", tag = "executors", security(("bearer" = [])),
    params(("id" = String, Path, description = "The action id")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "Lease extended", body = HeartbeatResponse),
        (status = 400, description = "Bad JSON, unknown field", body = ErrorBody),
        (status = 401, description = "No or unknown token", body = ErrorBody),
        (status = 403, description = "Not an executor token, or outside its scope", body = ErrorBody),
        (status = 404, description = "Unknown action", body = ErrorBody),
        (status = 409, description = "Stale, expired or superseded claim, or the turn is over", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 500, description = "Internal error (no details)", body = ErrorBody)))]
pub(crate) async fn heartbeat_action(
    State(state): State<AppState>,
    ExecutorCaller(scope): ExecutorCaller,
    Path(id): Path<String>,
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
