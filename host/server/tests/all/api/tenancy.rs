//! Tenants at every edge: agents owned by a tenant or shared by the operator with named
//! tenants, actions that carry their tenant, executors scoped to one tenant, operator acts
//! refused to tenant tokens unless granted, and decisions recorded under the token's name.

use serde_json::{Value, json};

use crate::common::*;

async fn put_agent(h: &Harness, token: &str, id: &str, extra: Value) -> (u16, Value) {
    let mut manifest = manifest();
    manifest["id"] = json!(id);
    let mut body = json!({"manifest": manifest, "implementationVersion": "1"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    h.call("PUT", &format!("/v1/agents/{id}"), Some(token), Some(body))
        .await
}

async fn agent_ids(h: &Harness, token: &str) -> Vec<String> {
    h.ok("GET", "/v1/agents", token, None).await["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| a["agentId"].as_str().expect("id").to_owned())
        .collect()
}

async fn open(h: &Harness, token: &str, path: &str, agent: &str) -> (u16, Value) {
    h.call(
        "PUT",
        path,
        Some(token),
        Some(json!({"agentId": agent, "ownerUserId": "u1"})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_are_seen_and_used_only_by_their_tenants() {
    let h = Harness::start().await;
    assert_eq!(put_agent(&h, OPERATOR, "private", json!({})).await.0, 200);
    let (status, body) = put_agent(&h, OPERATOR, "shared", json!({"sharedWith": ["acme"]})).await;
    assert_eq!(status, 200, "{body}");

    // Listing and reading: the operator sees all, with whom each is shared; acme only what is
    // shared with it (and not with whom else); beta nothing.
    assert_eq!(agent_ids(&h, OPERATOR).await, ["private", "shared"]);
    assert_eq!(agent_ids(&h, ACME).await, ["shared"]);
    assert!(agent_ids(&h, BETA).await.is_empty());
    let seen = h.ok("GET", "/v1/agents/shared", OPERATOR, None).await;
    assert_eq!(seen["sharedWith"], json!(["acme"]));
    assert_eq!(seen["tenantId"], Value::Null);
    let seen = h.ok("GET", "/v1/agents/shared", ACME, None).await;
    assert_eq!(seen["sharedWith"], Value::Null);
    for (token, agent) in [(BETA, "shared"), (ACME, "private"), (BETA, "private")] {
        let (status, body) = h
            .call("GET", &format!("/v1/agents/{agent}"), Some(token), None)
            .await;
        assert_error(status, &body, 404, "not_found");
    }

    // Using: a tenant opens sessions only on agents it sees, and cannot tell an unshared agent
    // from an unknown one.
    assert_eq!(open(&h, ACME, "/v1/sessions/a1", "shared").await.0, 200);
    for (token, agent) in [(BETA, "shared"), (ACME, "private"), (ACME, "nobody")] {
        let (status, body) = open(&h, token, "/v1/sessions/x", agent).await;
        assert_error(status, &body, 404, "not_found");
        assert_eq!(body["message"], format!("agent {agent:?} not found"));
    }
    // The operator acts for any tenant on its own agents.
    assert_eq!(
        open(&h, OPERATOR, "/v1/sessions/o1?tenantId=beta", "private")
            .await
            .0,
        200
    );

    // Registering: a tenant token needs canRegisterAgents, and then owns what it registers.
    let (status, body) = put_agent(&h, ACME, "mine", json!({})).await;
    assert_error(status, &body, 403, "forbidden");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("canRegisterAgents")
    );
    let (status, body) = put_agent(&h, GAMMA, "gamma-bot", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_ids(&h, GAMMA).await, ["gamma-bot"]);
    assert!(!agent_ids(&h, ACME).await.contains(&"gamma-bot".to_owned()));
    let owned = h.ok("GET", "/v1/agents/gamma-bot", OPERATOR, None).await;
    assert_eq!(owned["tenantId"], "gamma");
    assert_eq!(owned["sharedWith"], json!([]));
    assert_eq!(open(&h, GAMMA, "/v1/sessions/g1", "gamma-bot").await.0, 200);
    // ...never over another's id, for another tenant, or shared.
    let (status, body) = put_agent(&h, GAMMA, "private", json!({})).await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = put_agent(&h, GAMMA, "g2", json!({"tenantId": "beta"})).await;
    assert_error(status, &body, 403, "forbidden");
    let (status, body) = put_agent(&h, GAMMA, "g3", json!({"sharedWith": ["acme"]})).await;
    assert_error(status, &body, 403, "forbidden");
    // Nobody opens a session of one tenant on another tenant's agent, not even an operator.
    let (status, body) = open(&h, OPERATOR, "/v1/sessions/o2?tenantId=beta", "gamma-bot").await;
    assert_error(status, &body, 404, "not_found");

    // An operator registers for a tenant, or shares; not both, and only valid tenant names.
    let (status, body) = put_agent(&h, OPERATOR, "for-beta", json!({"tenantId": "beta"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_ids(&h, BETA).await, ["for-beta"]);
    for extra in [
        json!({"tenantId": "beta", "sharedWith": ["acme"]}),
        json!({"sharedWith": ["a/b"]}),
        json!({"tenantId": "*"}),
    ] {
        let (status, body) = put_agent(&h, OPERATOR, "bad", extra.clone()).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    // An executor token registers nothing.
    let (status, body) = put_agent(&h, EXECUTOR, "exec", json!({})).await;
    assert_error(status, &body, 403, "forbidden");
}

#[tokio::test(flavor = "multi_thread")]
async fn actions_carry_their_tenant_and_a_tenant_executor_sees_only_its_tenants() {
    let h = Harness::start().await;
    let hash = h.register_agent().await;
    // Two tenants, each with a session `dup` waiting on an action.
    for token in [ACME, BETA] {
        h.session("dup", token).await;
        h.say("dup", token, "m-action", "action").await;
        h.wait_status_as("dup", token, "waiting").await;
    }
    let tenants_of = |list: Value| -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = list["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .map(|a| {
                (
                    a["tenantId"].as_str().expect("tenant").to_owned(),
                    a["sessionId"].as_str().expect("session").to_owned(),
                )
            })
            .collect();
        pairs.sort();
        pairs
    };
    let all = h.ok("GET", "/v1/actions", EXECUTOR, None).await;
    let beta_action = all["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .find(|a| a["tenantId"] == "beta")
        .expect("beta's action")["actionId"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        tenants_of(all),
        [
            ("acme".to_owned(), "dup".to_owned()),
            ("beta".to_owned(), "dup".to_owned())
        ]
    );
    let acme_only = h.ok("GET", "/v1/actions", ACME_EXECUTOR, None).await;
    assert_eq!(
        tenants_of(acme_only.clone()),
        [("acme".to_owned(), "dup".to_owned())]
    );
    // Another tenant's action cannot be claimed or reported by the tenant's executor.
    let (status, body) = h
        .call(
            "POST",
            &format!("/v1/actions/{beta_action}/claim"),
            Some(ACME_EXECUTOR),
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    assert_error(status, &body, 403, "forbidden");
    let claim = h
        .ok(
            "POST",
            &format!("/v1/actions/{beta_action}/claim"),
            EXECUTOR,
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    assert_eq!(claim["action"]["tenantId"], "beta");
    let (status, body) = h
        .command(
            "dup",
            ACME_EXECUTOR,
            json!({"type": "action_result", "idempotencyKey": "r", "actionId": beta_action,
                "claimId": claim["claimId"], "generation": 1, "outcome": {"value": 1}}),
        )
        .await;
    // The path's session `dup` is acme's for nobody: an executor's session is the action's.
    assert!(status == 403 || status == 404, "{status} {body}");
    // The acme executor completes acme's action.
    let acme_action = acme_only["actions"][0]["actionId"]
        .as_str()
        .expect("id")
        .to_owned();
    let claim = h
        .ok(
            "POST",
            &format!("/v1/actions/{acme_action}/claim"),
            ACME_EXECUTOR,
            Some(json!({"manifestHash": hash, "implementationVersion": "1"})),
        )
        .await;
    let (status, body) = h
        .command(
            "dup",
            ACME_EXECUTOR,
            json!({"type": "action_result", "idempotencyKey": "r", "actionId": acme_action,
                "claimId": claim["claimId"], "generation": 1, "outcome": {"value": 1}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.wait_status_as("dup", ACME, "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resolve_is_an_operators_act_unless_granted_and_decisions_name_their_token() {
    let h = Harness::start().await;
    h.register_agent().await;
    let resolve =
        json!({"type": "resolve", "idempotencyKey": "v", "effectId": "nope", "retry": true});
    h.session("s1", ACME).await;
    let (status, body) = h.command("s1", ACME, resolve.clone()).await;
    assert_error(status, &body, 403, "forbidden");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("canResolve")
    );
    // A granted tenant token gets past the check (to the unknown effect).
    h.session("s1", GAMMA).await;
    let (status, body) = h.command("s1", GAMMA, resolve.clone()).await;
    assert_error(status, &body, 404, "not_found");

    // Approve under the configured name, in the event and in the session view.
    let turn = h.say("s1", GAMMA, "m-pause", "pause").await["turnId"]
        .as_str()
        .expect("turn")
        .to_owned();
    let view = h.wait_status_as("s1", GAMMA, "paused").await;
    assert_eq!(view["lastDecision"], Value::Null);
    let (status, body) = h
        .command(
            "s1",
            GAMMA,
            json!({"type": "approve", "idempotencyKey": "a", "interactionId": format!("{turn}:0"), "approved": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let view = h.wait_status_as("s1", GAMMA, "completed").await;
    assert_eq!(
        view["lastDecision"],
        json!({"command": "approve", "interactionId": format!("{turn}:0"), "approved": true,
            "decidedBy": "gamma-admin"})
    );
    let events = h
        .ok(
            "GET",
            "/v1/sessions/s1/items?cursor=0&limit=1000",
            GAMMA,
            None,
        )
        .await;
    let approve = events["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|e| e["type"] == "command.approve")
        .cloned()
        .expect("command.approve");
    assert_eq!(approve["data"]["decidedBy"], "gamma-admin");
    // The secret never appears anywhere the session shows.
    assert!(!events.to_string().contains(GAMMA));
    assert!(!view.to_string().contains(GAMMA));
}
