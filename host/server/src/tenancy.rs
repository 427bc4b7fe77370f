//! Tenant-qualified session keys: a session id is unique within its tenant, so two tenants may
//! both have a session `s1`, and neither can learn that the other's exists.
//!
//! The store keys a session by `TENANT/ID`. A tenant never contains `/` (checked where tenants
//! enter: the configuration's tokens and an operator's `tenantId`), so the first `/` of a key
//! splits it unambiguously and a session id may contain anything, `/` included. The wire only
//! ever shows the id within the tenant (`id`, an event's `sessionId`, an action's `sessionId`)
//! beside the tenant (`tenantId`).
//!
//! Who addresses which tenant: a tenant token always its own; an operator token the `tenantId`
//! query parameter of a session route, or [`DEFAULT_TENANT`] without one; an executor the
//! session of the action it reports on.

use crate::error::ApiError;

/// The tenant of sessions created by an operator token without `tenantId`.
pub const DEFAULT_TENANT: &str = "default";

/// The longest tenant name.
pub const MAX_TENANT: usize = 100;

/// The store key of session `id` of `tenant`.
pub fn session_key(tenant: &str, id: &str) -> String {
    format!("{tenant}/{id}")
}

/// The id within its tenant of the session stored under `key`.
pub fn public_id(key: &str) -> &str {
    key.split_once('/').map_or(key, |(_, id)| id)
}

/// The tenant of the session stored under `key`.
pub fn tenant_of(key: &str) -> &str {
    key.split_once('/')
        .map_or(DEFAULT_TENANT, |(tenant, _)| tenant)
}

/// Why `tenant` is not a valid tenant name, if it is not: 1 to [`MAX_TENANT`] ASCII letters,
/// digits, `-`, `_` or `.`.
pub fn tenant_problem(tenant: &str) -> Option<String> {
    if tenant.is_empty() || tenant.len() > MAX_TENANT {
        return Some(format!("must have 1 to {MAX_TENANT} characters"));
    }
    if !tenant
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some("may only contain ASCII letters, digits, '-', '_' and '.'".to_owned());
    }
    None
}

/// The tenant an application caller addresses: its own (a different `asked` is 403), or for an
/// operator `asked`, else [`DEFAULT_TENANT`].
pub fn addressed_tenant(own: Option<&str>, asked: Option<&str>) -> Result<String, ApiError> {
    match (own, asked) {
        (Some(own), Some(asked)) if own != asked => Err(ApiError::Forbidden(
            "tenantId may only be chosen by an operator token".to_owned(),
        )),
        (Some(own), _) => Ok(own.to_owned()),
        (None, Some(asked)) => match tenant_problem(asked) {
            Some(problem) => Err(ApiError::InvalidRequest(format!("tenantId {problem}"))),
            None => Ok(asked.to_owned()),
        },
        (None, None) => Ok(DEFAULT_TENANT.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_at_the_tenant_whatever_the_id_holds() {
        for id in ["s1", "a/b", "/", "", "x/y/z"] {
            let key = session_key("acme", id);
            assert_eq!(public_id(&key), id);
            assert!(key.starts_with("acme/"));
        }
        // Only because no tenant holds a `/` ("a" + "b/c" and "a/b" + "c" would share a key).
        assert!(tenant_problem("a/b").is_some());
    }

    #[test]
    fn tenant_names_exclude_the_separator() {
        assert_eq!(tenant_problem("acme-1.eu_west"), None);
        for bad in ["", "a/b", "a b", "é", &"x".repeat(MAX_TENANT + 1)] {
            assert!(tenant_problem(bad).is_some(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn tenant_tokens_cannot_address_another_tenant() {
        assert_eq!(
            addressed_tenant(Some("acme"), None).ok().as_deref(),
            Some("acme")
        );
        assert_eq!(
            addressed_tenant(Some("acme"), Some("acme")).ok().as_deref(),
            Some("acme")
        );
        assert!(matches!(
            addressed_tenant(Some("acme"), Some("beta")),
            Err(ApiError::Forbidden(_))
        ));
        assert_eq!(
            addressed_tenant(None, Some("beta")).ok().as_deref(),
            Some("beta")
        );
        assert_eq!(
            addressed_tenant(None, None).ok().as_deref(),
            Some(DEFAULT_TENANT)
        );
        assert!(matches!(
            addressed_tenant(None, Some("a/b")),
            Err(ApiError::InvalidRequest(_))
        ));
    }
}
