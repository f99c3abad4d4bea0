//! Hostile uploads: crafted source archives are refused when they are uploaded (the worker
//! checks again as it unpacks: `archive/tests/unpack.rs`), and a blob that is not a checked
//! archive can never be a job's source.

use crate::server;
use sha2::{Digest, Sha256};
use testkit::ServerOptions;

/// A tar.gz of raw entries (kind, path, link target, data), past the tar crate's own checks.
fn crafted(entries: &[(tar::EntryType, &str, &str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (kind, path, link, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &builder.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread")]
async fn crafted_source_archives_are_refused_at_upload_and_a_non_archive_is_never_a_source() {
    use tar::EntryType::{Char, Directory, Link, Regular, Symlink};
    let server = server(ServerOptions::default()).await;
    let http = server.http();
    let put = |bytes: Vec<u8>| {
        let http = http.clone();
        let url = format!("{}/v1/blobs/{}", server.url, sha256(&bytes));
        let token = server.admin_token.clone();
        async move {
            let resp = http
                .put(&url)
                .bearer_auth(&token)
                .body(bytes)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            let head = http.head(&url).bearer_auth(&token).send().await.unwrap();
            (
                status,
                body["message"].as_str().unwrap_or("").to_string(),
                head.status().as_u16(),
            )
        }
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            crafted(&[(Regular, "../escape", "", b"x")]),
            "refusing to unpack ../escape",
        ),
        (
            crafted(&[(Regular, "/etc/cron.d/job", "", b"x")]),
            "cron.d/job",
        ),
        (
            crafted(&[(Symlink, "out", "../../../etc", b"")]),
            "points outside the destination",
        ),
        (
            crafted(&[
                (Directory, "d", "", b""),
                (Symlink, "link", "d", b""),
                (Regular, "link/x", "", b"x"),
            ]),
            "written through the symlink link",
        ),
        (
            crafted(&[(Regular, "a", "", b"x"), (Link, "b", "a", b"")]),
            "Link entry",
        ),
        (crafted(&[(Char, "null", "", b"")]), "Char entry"),
        (
            // Starts like a tar.gz, is not one.
            vec![0x1f, 0x8b, 0x08, 0x00, 1, 2, 3, 4],
            "corrupt or not a tar.gz",
        ),
    ];
    for (bytes, expect) in cases {
        let (status, message, head) = put(bytes).await;
        assert_eq!(status, 400, "{expect}: {message}");
        assert!(
            message.contains("the source was refused") && message.contains(expect),
            "{expect}: {message}"
        );
        assert_eq!(head, 404, "a refused upload is not stored ({expect})");
    }

    // A good archive is stored; a blob that is not an archive is stored too (pickled
    // functions are), but a job naming it as its source is refused.
    let good = crafted(&[(Regular, "run.sh", "", b"echo hi\n")]);
    assert_eq!(put(good.clone()).await.0, 201);
    // Padding after the gzip stream (some tools write it) is stored with the archive.
    let padded = [good.clone(), vec![0u8; 1 << 20]].concat();
    assert_eq!(put(padded).await.0, 201);
    let opaque = b"\x80\x05 a pickled function".to_vec();
    assert_eq!(put(opaque.clone()).await.0, 201);
    let submit = |digest: String, bytes: usize| {
        let http = http.clone();
        let url = format!("{}/v1/jobs", server.url);
        let token = server.admin_token.clone();
        async move {
            let resp = http
                .post(&url)
                .bearer_auth(&token)
                .json(&serde_json::json!({"spec": {
                    "command": ["sh", "run.sh"], "accelerator": "cpu",
                    "source": {"digest": digest, "bytes": bytes, "files": 1},
                }}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, body["message"].as_str().unwrap_or("").to_string())
        }
    };
    let (status, message) = submit(sha256(&opaque), opaque.len()).await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("is not a source archive"), "{message}");
    let (status, message) = submit(sha256(&good), good.len()).await;
    assert_eq!(status, 200, "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn text_with_a_nul_character_is_refused_as_bad_input_not_a_server_error() {
    // Found by the API fuzz run: PostgreSQL stores no NUL in text or jsonb.
    let server = server(ServerOptions::default()).await;
    let http = server.http();
    let post = |path: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", server.url))
            .bearer_auth(&server.admin_token)
            .json(&body)
            .send()
    };
    for spec in [
        serde_json::json!({"command": ["echo", "a\u{0}b"], "accelerator": "cpu"}),
        serde_json::json!({"command": ["true"], "accelerator": "cpu", "name": "n\u{0}"}),
        serde_json::json!({"command": ["true"], "accelerator": "cpu",
                           "env": [{"name": "K", "value": "v\u{0}"}]}),
    ] {
        let resp = post("/v1/jobs", serde_json::json!({ "spec": spec }))
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 400, "{spec}: {text}");
    }
    let resp = post(
        "/v1/workers/1/tasks/1/attempts/1/rendezvous",
        serde_json::json!({"addr": "\u{0}", "port": 1}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let text = resp.text().await.unwrap();
    assert!(text.contains("NUL character"), "{text}");
}
