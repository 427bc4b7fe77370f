//! Bearer tokens: who is calling, checked before anything else.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use corral_store::ExecutorScope;

use crate::config::{Grants, Role};
use crate::error::ApiError;
use crate::runtime::Runtime;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An application; `tenant: None` is an operator.
    Application {
        /// The tenant the token is scoped to.
        tenant: Option<String>,
        /// The token's configured name (recorded as `decidedBy`).
        name: String,
        /// The operator acts a tenant token is granted.
        grants: Grants,
    },
    /// An executor scoped to one agent definition (and perhaps one tenant).
    Executor(ExecutorScope),
}

impl Caller {
    /// The token's name, recorded as `decidedBy` (executors decide nothing).
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Application { name, .. } => Some(name),
            Caller::Executor(_) => None,
        }
    }

    /// Whether the caller may do what `grant` picks: operators always, tenant tokens when the
    /// configuration grants it, executors never.
    pub fn may(&self, grant: impl Fn(&Grants) -> bool) -> bool {
        match self {
            Caller::Application { tenant: None, .. } => true,
            Caller::Application { grants, .. } => grant(grants),
            Caller::Executor(_) => false,
        }
    }

    /// The application tenant scope, or 403 for an executor token.
    pub fn application(&self) -> Result<Option<&str>, ApiError> {
        match self {
            Caller::Application { tenant, .. } => Ok(tenant.as_deref()),
            Caller::Executor(_) => Err(ApiError::Forbidden(
                "an executor token may only use the executor routes".to_owned(),
            )),
        }
    }

    /// Operator tokens only (application tokens without a tenant).
    pub fn operator(&self) -> Result<(), ApiError> {
        match self.application()? {
            None => Ok(()),
            Some(_) => Err(ApiError::Forbidden(
                "this route needs an operator token (an application token without a tenant)"
                    .to_owned(),
            )),
        }
    }

    /// The executor scope, or 403 for an application token.
    pub fn executor(&self) -> Result<&ExecutorScope, ApiError> {
        match self {
            Caller::Executor(scope) => Ok(scope),
            Caller::Application { .. } => Err(ApiError::Forbidden(
                "this route needs an executor token".to_owned(),
            )),
        }
    }
}

impl FromRequestParts<Arc<Runtime>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        runtime: &Arc<Runtime>,
    ) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(AUTHORIZATION).ok_or_else(|| {
            ApiError::Unauthorized("an Authorization: Bearer token is required".to_owned())
        })?;
        // The scheme is case-insensitive (RFC 9110 section 11.1): `bearer`, `BEARER`...
        let token = header
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be `Bearer TOKEN`".to_owned())
            })?;
        let found = runtime
            .tokens
            .authenticate(token)
            .ok_or_else(|| ApiError::Unauthorized("the token is not valid".to_owned()))?;
        Ok(match found.role {
            Role::Application { tenant } => Caller::Application {
                tenant,
                name: found.name,
                grants: found.grants,
            },
            Role::Executor(scope) => Caller::Executor(scope),
        })
    }
}

/// An application caller (403 for executor tokens, before the body is read); the tenant scope.
#[derive(Debug, Clone)]
pub struct AppCaller(pub Option<String>);

/// An application caller (403 for executor tokens, before the body is read), whole: its
/// tenant, name and grants.
#[derive(Debug, Clone)]
pub struct AppToken(pub Caller);

impl FromRequestParts<Arc<Runtime>> for AppToken {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        runtime: &Arc<Runtime>,
    ) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, runtime).await?;
        caller.application()?;
        Ok(AppToken(caller))
    }
}

/// An operator caller: an application token without a tenant.
#[derive(Debug, Clone)]
pub struct OperatorCaller;

/// An executor caller and its scope (403 for application tokens).
#[derive(Debug, Clone)]
pub struct ExecutorCaller(pub ExecutorScope);

impl FromRequestParts<Arc<Runtime>> for AppCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        runtime: &Arc<Runtime>,
    ) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, runtime).await?;
        Ok(AppCaller(caller.application()?.map(str::to_owned)))
    }
}

impl FromRequestParts<Arc<Runtime>> for OperatorCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        runtime: &Arc<Runtime>,
    ) -> Result<Self, ApiError> {
        Caller::from_request_parts(parts, runtime)
            .await?
            .operator()?;
        Ok(OperatorCaller)
    }
}

impl FromRequestParts<Arc<Runtime>> for ExecutorCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        runtime: &Arc<Runtime>,
    ) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, runtime).await?;
        Ok(ExecutorCaller(caller.executor()?.clone()))
    }
}
