//! The OpenAPI 3.1 description, generated from the types and handlers the routes use.

use std::sync::OnceLock;

use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::error::{ErrorBody, ErrorCode};
use crate::manifest::{Approval, Limits, Manifest, Mode, ModelSpec, ScriptedReply, ToolCall};
use crate::routes;
use crate::wire::*;

#[derive(OpenApi)]
#[openapi(
    info(title = "corral serve", description = "The durable runtime server of corral."),
    paths(
        routes::health, routes::ready, routes::metrics, routes::openapi,
        routes::list_agents, routes::put_agent,
        routes::list_sessions, routes::put_session, routes::get_session,
        routes::post_command, routes::get_items, routes::get_events,
        routes::executor_connect, routes::list_actions, routes::claim_action,
        routes::heartbeat_action,
    ),
    components(schemas(
        ErrorBody, ErrorCode, Manifest, ModelSpec, ScriptedReply, ToolCall, Mode, Approval, Limits,
        PutAgent, AgentPut, AgentView, AgentList, UserInfo, PutSession, Status, SessionSummary,
        SessionList, SessionView, UncertainEffect, ActionView, Command, Accepted, EventView,
        ItemsPage, ActionList, ClaimRequest, ClaimResponse, HeartbeatRequest, HeartbeatResponse,
        Health, Ready,
    )),
    modifiers(&Bearer),
)]
struct ApiDoc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The description.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The description as JSON text (rendered once).
pub fn document_json() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| document().to_json().unwrap_or_else(|_| "{}".to_owned()))
}
