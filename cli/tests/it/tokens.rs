//! Tokens: every endpoint refuses every role that may not call it, and only that role;
//! `gpulayer token` creates, lists and revokes them; expired and revoked tokens are refused;
//! every job names the token that submitted it.

use crate::server;
use std::collections::BTreeMap;
use std::time::Duration;
use testkit::{Cli, ServerOptions};

const ROLES: [&str; 4] = ["admin", "submitter", "read-only", "worker"];

/// What each role may call: the rights table of docs/security.md.
fn may(role: &str, right: &str) -> bool {
    match (role, right) {
        ("admin", _) | (_, "public") => true,
        ("submitter", r) => matches!(r, "read" | "submit" | "sources"),
        ("read-only", r) => matches!(r, "read" | "sources"),
        ("worker", r) => matches!(r, "worker" | "sources"),
        _ => false,
    }
}

/// Every operation of the API and the right it needs. The test fails for an operation the
/// OpenAPI document has and this table lacks, so a new endpoint cannot skip the matrix.
fn rights() -> BTreeMap<(&'static str, &'static str), &'static str> {
    [
        (("get", "/v1/jobs"), "read"),
        (("post", "/v1/jobs"), "submit"),
        (("post", "/v1/jobs/batch"), "submit"),
        (("get", "/v1/jobs/{id}"), "read"),
        (("post", "/v1/jobs/{id}/cancel"), "submit"),
        (("get", "/v1/jobs/{id}/logs"), "read"),
        (("get", "/v1/jobs/{id}/logs/ws"), "read"),
        (("get", "/v1/jobs/{id}/outputs"), "read"),
        (("post", "/v1/placement"), "read"),
        (("post", "/v1/calls"), "submit"),
        (("post", "/v1/calls/results"), "read"),
        (("put", "/v1/blobs/{digest}"), "submit"),
        (("head", "/v1/blobs/{digest}"), "sources"),
        (("get", "/v1/blobs/{digest}"), "sources"),
        (("get", "/v1/workers"), "read"),
        (("post", "/v1/workers"), "worker"),
        (("delete", "/v1/workers/{worker}"), "worker"),
        (("post", "/v1/workers/{worker}/poll"), "worker"),
        (("post", "/v1/workers/{worker}/heartbeat"), "worker"),
        (
            (
                "post",
                "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/logs",
            ),
            "worker",
        ),
        (
            (
                "post",
                "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/rendezvous",
            ),
            "worker",
        ),
        (
            (
                "get",
                "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/rendezvous",
            ),
            "worker",
        ),
        (
            (
                "put",
                "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/outputs",
            ),
            "worker",
        ),
        (("post", "/v1/tokens"), "tokens"),
        (("get", "/v1/tokens"), "tokens"),
        (("post", "/v1/tokens/{id}/revoke"), "tokens"),
        (("post", "/v1/dashboard/links"), "read"),
    ]
    .into_iter()
    .collect()
}

fn with_token(cli: &Cli, token: &str) -> Cli {
    Cli {
        token: token.to_string(),
        ..cli.clone()
    }
}

fn create(cli: &Cli, role: &str, name: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["token", "create", "--role", role, "--name", name, "--json"];
    args.extend_from_slice(extra);
    cli.run(&args).success().json()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_endpoint_refuses_exactly_the_roles_that_may_not_call_it() {
    let server = server(ServerOptions::default()).await;
    let admin = server.cli();
    let mut secrets = BTreeMap::new();
    for role in ROLES {
        let created = create(&admin, role, &format!("matrix-{role}"), &[]);
        let secret = created["secret"].as_str().unwrap().to_string();
        let prefix = match role {
            "admin" => "gla_",
            "submitter" => "gls_",
            "read-only" => "glr_",
            _ => "glj_",
        };
        assert!(secret.starts_with(prefix), "{role}: {secret}");
        assert_eq!(created["token"]["role"], role);
        secrets.insert(role, secret);
    }
    let job = admin.submit(&["--", "true"]);
    let victim = create(&admin, "read-only", "to-revoke", &[])["token"]["id"]
        .as_i64()
        .unwrap();

    let doc = crate::openapi(&server).await;
    let table = rights();
    let mut seen = 0;
    let http = server.http();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            let right = *table
                .get(&(method.as_str(), path.as_str()))
                .unwrap_or_else(|| {
                    panic!("{method} {path} is not in the rights table of this test")
                });
            seen += 1;
            // The revoke route gets a token nobody else uses: an admin's call revokes it.
            let id = if path.starts_with("/v1/tokens/") {
                victim
            } else {
                job
            };
            let url = format!(
                "{}{}",
                server.url,
                path.replace("{id}", &id.to_string())
                    .replace("{digest}", &"0".repeat(64))
                    .replace("{worker}", "999999")
                    .replace("{task}", "1")
                    .replace("{attempt}", "1")
            );
            for role in ROLES {
                let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let mut req = http.request(m, &url).bearer_auth(&secrets[role]);
                if matches!(method.as_str(), "post" | "put") {
                    req = req.json(&serde_json::json!({}));
                }
                let status = req.send().await.unwrap().status().as_u16();
                if may(role, right) {
                    assert!(
                        status != 401 && status != 403,
                        "{role} may {method} {path} ({right}) but got {status}"
                    );
                } else {
                    assert_eq!(
                        status, 403,
                        "{role} may not {method} {path} ({right}) but got {status}"
                    );
                }
            }
        }
    }
    assert_eq!(
        seen,
        table.len(),
        "the table names operations the API lacks"
    );
    // Without a token (or with an unknown one) every operation is refused before anything.
    for token in [None, Some("gla_not-a-token")] {
        let mut req = http.get(format!("{}/v1/jobs", server.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        assert_eq!(req.send().await.unwrap().status().as_u16(), 401);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_created_listed_and_revoked_and_jobs_name_theirs() {
    let server = server(ServerOptions::default()).await;
    let admin = server.cli();
    let bot = create(&admin, "submitter", "ci-bot", &[]);
    let bot_cli = with_token(&admin, bot["secret"].as_str().unwrap());
    let job = bot_cli.submit(&["--", "true"]);
    assert_eq!(admin.status(job)["submitted_by"], "ci-bot");
    let listed = admin.run(&["jobs"]).success();
    assert!(listed.stdout.contains("ci-bot"), "{}", listed.stdout);

    // A submitter cannot make itself more.
    let refused = bot_cli.run(&["token", "create", "--role", "admin", "--name", "me"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused
            .stderr
            .contains("token 'ci-bot' has role submitter which may not manage tokens"),
        "{}",
        refused.stderr
    );

    // The plain create prints the secret alone on stdout.
    let plain = admin
        .run(&["token", "create", "--role", "read-only", "--name", "viewer"])
        .success();
    let viewer = plain.stdout.trim().to_string();
    assert!(
        viewer.starts_with("glr_") && !viewer.contains(' '),
        "{}",
        plain.stdout
    );
    assert!(plain.stderr.contains("shown this once"), "{}", plain.stderr);
    let viewer_cli = with_token(&admin, &viewer);
    viewer_cli.run(&["jobs"]).success();
    let no = viewer_cli.run(&["submit", "--", "true"]);
    assert!(no.stderr.contains("may not submit"), "{}", no.stderr);

    let list = admin.run(&["token", "list", "--json"]).success().json();
    let names: Vec<&str> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"ci-bot") && names.contains(&"viewer"),
        "{names:?}"
    );
    let bot_row = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci-bot")
        .unwrap();
    assert_eq!(bot_row["jobs"], 1);
    assert_eq!(bot_row["created_by"], "admin");
    assert!(!list.to_string().contains(bot["secret"].as_str().unwrap()));

    // Revoked by name: refused at once (this replica forgets it), gone from the list.
    let revoked = admin
        .run(&["token", "revoke", "ci-bot", "--json"])
        .success()
        .json();
    assert_eq!(revoked["state"], "revoked");
    let after = bot_cli.run(&["jobs"]);
    assert_ne!(after.code, 0);
    assert!(after.stderr.contains("revoked"), "{}", after.stderr);
    let live = admin.run(&["token", "list", "--json"]).success().json();
    assert!(!live.to_string().contains("ci-bot"));
    let all = admin
        .run(&["token", "list", "--all", "--json"])
        .success()
        .json();
    assert!(all.to_string().contains("ci-bot"));

    // An expiring token works until it expires.
    let brief = create(&admin, "read-only", "brief", &["--expires", "2s"]);
    let brief_cli = with_token(&admin, brief["secret"].as_str().unwrap());
    brief_cli.run(&["jobs"]).success();
    // (The replica trusts a verified token for a few seconds, never past its expiry.)
    std::thread::sleep(Duration::from_millis(2500));
    let expired = brief_cli.run(&["jobs"]);
    assert_ne!(expired.code, 0);
    assert!(expired.stderr.contains("expired"), "{}", expired.stderr);

    // Bad input: one line each.
    for (args, expect) in [
        (
            vec!["token", "create", "--role", "root", "--name", "x"],
            "unknown role 'root'",
        ),
        (
            vec!["token", "create", "--role", "admin", "--name", "two words"],
            "may hold letters, digits",
        ),
        (
            vec![
                "token",
                "create",
                "--role",
                "admin",
                "--name",
                "x",
                "--expires",
                "1w",
            ],
            "is not a duration",
        ),
        (
            vec!["token", "revoke", "nobody"],
            "no live token is named 'nobody'",
        ),
        (
            vec!["token", "revoke", "424242"],
            "there is no token 424242",
        ),
        // The only admin token cannot go: nobody could manage tokens after it.
        (
            vec!["token", "revoke", "admin"],
            "is the last live admin token",
        ),
    ] {
        let out = admin.run(&args);
        assert_ne!(out.code, 0, "{args:?}");
        assert!(out.stderr.contains(expect), "{args:?}: {}", out.stderr);
    }
}
