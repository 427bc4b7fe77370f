//! The OpenAPI 3.1 description, generated from the route table ([`crate::routes`]) and the types
//! its handlers use: nothing here lists a route.

use std::sync::OnceLock;

use utoipa::OpenApi;
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};

use crate::error::{ErrorBody, ErrorCode};
use crate::manifest::{Approval, Limits, Manifest, Mode, ModelSpec, ScriptedReply, ToolCall};
use crate::wire::*;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "corral serve",
        description = "The durable runtime server of corral. Every request and response field \
            is camelCase; unknown fields and unknown query parameters are refused (400); a known \
            path with another method is 405 with `Allow`; every error is the `ErrorBody` \
            envelope, whose `code` each response names. See docs/api.md."
    ),
    components(schemas(
        ErrorBody, ErrorCode, Manifest, ModelSpec, ScriptedReply, ToolCall, Mode, Approval, Limits,
        PutAgent, AgentPut, AgentView, AgentList, UserInfo, PutSession, Status, SessionSummary,
        SessionList, SessionView, Waits, PendingInteraction, WaitingEffects, TurnError, LastDecision,
        UncertainEffect, ActionView, Command, Outcome, Accepted, EventView, ItemsPage, ActionList,
        ClaimRequest, ClaimResponse, HeartbeatRequest, HeartbeatResponse, Health, Ready,
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

/// The document without its paths: info, component schemas, the security scheme. The route
/// table adds every path to it.
pub(crate) fn base() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The description: [`base`] with every route of the table, and each error response's body
/// narrowed to the one `code` its status carries.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut document = crate::routes::table().into_openapi();
    name_error_codes(&mut document);
    close_variants(&mut document, &["Command", "Outcome"]);
    document
}

/// The description as JSON text (rendered once).
pub fn document_json() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| document().to_json().unwrap_or_else(|_| "{}".to_owned()))
}

/// Every response with an error status and the `ErrorBody` body becomes `ErrorBody` with `code`
/// fixed to that status's code ([`ErrorCode::ALL`]), so the document says which code each
/// status of each route carries.
fn name_error_codes(document: &mut utoipa::openapi::OpenApi) {
    let error_body = format!(
        "#/components/schemas/{}",
        <ErrorBody as utoipa::ToSchema>::name()
    );
    for item in document.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            for (status, response) in operation.responses.responses.iter_mut() {
                let Some(code) = status.parse::<u16>().ok().and_then(ErrorCode::of_status) else {
                    continue;
                };
                let RefOr::T(response) = response else {
                    continue;
                };
                let message = response.description.clone();
                for content in response.content.values_mut() {
                    let is_error_body = matches!(
                        &content.schema,
                        Some(RefOr::Ref(reference)) if reference.ref_location == error_body
                    );
                    if !is_error_body {
                        continue;
                    }
                    let narrowed = ObjectBuilder::new().property(
                        "code",
                        ObjectBuilder::new()
                            .schema_type(SchemaType::Type(Type::String))
                            .enum_values(Some([code.as_str()])),
                    );
                    content.schema = Some(RefOr::T(Schema::AllOf(
                        AllOfBuilder::new()
                            .item(Ref::new(error_body.clone()))
                            .item(narrowed)
                            .build(),
                    )));
                    content.example = Some(serde_json::json!({
                        "status": "rejected",
                        "code": code.as_str(),
                        "message": message,
                    }));
                }
            }
        }
    }
}

/// The variants of these enums refuse unknown fields (`deny_unknown_fields` on the enum, which
/// utoipa does not carry to each variant's object): their schemas say so too.
fn close_variants(document: &mut utoipa::openapi::OpenApi, enums: &[&str]) {
    let Some(components) = document.components.as_mut() else {
        return;
    };
    for name in enums {
        let Some(RefOr::T(Schema::OneOf(one_of))) = components.schemas.get_mut(*name) else {
            continue;
        };
        for item in &mut one_of.items {
            if let RefOr::T(Schema::Object(object)) = item {
                object.additional_properties =
                    Some(Box::new(AdditionalProperties::FreeForm(false)));
            }
        }
    }
}
