//! A session's lifecycle seen from the list and the erase route: filters, keyset paging,
//! counts by status, and erasure of everything stored for a session.

use serde_json::{Value, json};

use crate::common::*;

fn ids(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s["tenantId"].as_str().unwrap_or(""),
                s["id"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_filtered_paged_and_counted() {
    let h = Harness::start().await;
    h.register_agent().await;
    for id in ["a", "b", "c", "d", "e"] {
        h.session(id, OPERATOR).await;
    }
    h.session("x", ACME).await;
    h.message("b", "k", "pause").await;
    h.wait_status("b", "paused").await;
    h.message("c", "k", "hello").await;
    h.wait_status("c", "completed").await;

    // Counts over the other filters, by wire status.
    let all = h.ok("GET", "/v1/sessions", OPERATOR, None).await;
    assert_eq!(
        all["counts"],
        json!({"idle": 4, "paused": 1, "completed": 1})
    );
    assert_eq!(all["next"], Value::Null);
    assert_eq!(ids(&all).len(), 6);
    let paused = h
        .ok("GET", "/v1/sessions?status=paused,waiting", OPERATOR, None)
        .await;
    assert_eq!(ids(&paused), ["default/b"]);
    assert_eq!(paused["counts"], all["counts"]);
    let acme = h.ok("GET", "/v1/sessions", ACME, None).await;
    assert_eq!(ids(&acme), ["acme/x"]);
    assert_eq!(acme["counts"], json!({"idle": 1}));
    let owned = h
        .ok("GET", "/v1/sessions?ownerUserId=nobody", OPERATOR, None)
        .await;
    assert!(ids(&owned).is_empty());
    assert_eq!(owned["counts"], json!({}));

    // Keyset pages of two, in a stable order, each session exactly once.
    let mut seen = Vec::new();
    let mut path = "/v1/sessions?tenantId=default&limit=2".to_owned();
    loop {
        let page = h.ok("GET", &path, OPERATOR, None).await;
        assert!(ids(&page).len() <= 2);
        seen.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => {
                path = format!(
                    "/v1/sessions?tenantId=default&limit=2&after={}",
                    next.replace('/', "%2F")
                )
            }
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "default/a",
            "default/b",
            "default/c",
            "default/d",
            "default/e"
        ]
    );

    // Bad filters are named.
    for bad in ["status=sleeping", "limit=0", "limit=1001", "status="] {
        let (status, body) = h
            .call("GET", &format!("/v1/sessions?{bad}"), Some(OPERATOR), None)
            .await;
        assert_error(status, &body, 400, "invalid_request");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_erased_with_everything_stored_for_it() {
    let h = Harness::start().await;
    h.register_agent().await;
    h.session("s1", OPERATOR).await;
    h.message("s1", "k1", "pause").await;
    h.wait_status("s1", "paused").await;
    // A turn in progress: refused unless asked to cancel.
    let (status, body) = h
        .call("DELETE", "/v1/sessions/s1", Some(OPERATOR), None)
        .await;
    assert_error(status, &body, 409, "conflict");
    // Another tenant cannot, and cannot tell it exists; an executor cannot at all.
    let (status, body) = h.call("DELETE", "/v1/sessions/s1", Some(ACME), None).await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = h
        .call("DELETE", "/v1/sessions/s1", Some(EXECUTOR), None)
        .await;
    assert_error(status, &body, 403, "forbidden");
    let (status, _) = h
        .call(
            "DELETE",
            "/v1/sessions/s1?cancel=true",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, 204);
    for path in ["/v1/sessions/s1", "/v1/sessions/s1/items?cursor=0"] {
        let (status, body) = h.call("GET", path, Some(OPERATOR), None).await;
        assert_error(status, &body, 404, "not_found");
    }
    // The id is free again, with a history that starts over.
    h.session("s1", OPERATOR).await;
    let page = h
        .ok("GET", "/v1/sessions/s1/items?cursor=0", OPERATOR, None)
        .await;
    assert_eq!(page["items"], json!([]));
    // The owning tenant erases its own settled session.
    h.session("t1", ACME).await;
    let (status, _) = h.call("DELETE", "/v1/sessions/t1", Some(ACME), None).await;
    assert_eq!(status, 204);
    let (status, body) = h.call("DELETE", "/v1/sessions/t1", Some(ACME), None).await;
    assert_error(status, &body, 404, "not_found");
}
