//! TLS by default: the self-signed certificate kept for every replica, pinning by
//! fingerprint in the CLI and the worker, a given certificate, and plain HTTP on loopback only.

use crate::bad_input::one_line_error;
use crate::{bin, server};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::{Cli, CliOutput, Server, ServerOptions};

const WRONG: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn output(out: std::process::Output) -> CliOutput {
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_pinned_to_another_certificate_is_refused_and_names_both_fingerprints() {
    let server = server(ServerOptions::default()).await;
    let fingerprint = server.fingerprint.clone().expect("TLS is on by default");
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let pinned = server.cli();
    pinned.run(&["jobs"]).success();

    let wrong = Cli {
        fingerprint: Some(WRONG.into()),
        ..server.cli()
    };
    let refused = wrong.run(&["jobs"]);
    one_line_error(
        &refused,
        &format!("presented the certificate {fingerprint}, not the pinned {WRONG}"),
    );
    // The flag wins over the environment, and is refused the same way.
    let flag = pinned.run(&["jobs", "--fingerprint", WRONG]);
    one_line_error(&flag, "not the pinned");
    // A mistyped fingerprint is refused before any connection.
    one_line_error(
        &pinned.run(&["jobs", "--fingerprint", "sha256:abc"]),
        "is not a certificate fingerprint",
    );

    // With no fingerprint, the self-signed certificate is not trusted, and the error says
    // what to set.
    let unpinned = Cli {
        fingerprint: None,
        ..server.cli()
    };
    one_line_error(
        &unpinned.run(&["jobs"]),
        "does not trust (invalid peer certificate: UnknownIssuer): pin it with GPULAYER_FINGERPRINT",
    );
    // Plain http to the TLS port gets a plain answer to act on, not a dropped connection.
    let plain = Cli {
        url: server.url.replacen("https://", "http://", 1),
        fingerprint: None,
        ..server.cli()
    };
    one_line_error(
        &plain.run(&["jobs"]),
        "this server speaks HTTPS: use https://",
    );
    // A pin with a plain-http URL is a contradiction, refused as such.
    let pinned_plain = Cli {
        url: server.url.replacen("https://", "http://", 1),
        ..server.cli()
    };
    one_line_error(&pinned_plain.run(&["jobs"]), "is plain http: use https://");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_pinned_to_another_certificate_stops_at_once_instead_of_retrying() {
    let server = server(ServerOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(["join", &server.url, "--token", &server.join_token])
        .args(["--name", "w", "--fingerprint", WRONG])
        .arg("--work-dir")
        .arg(dir.path())
        .env_remove("GPULAYER_FINGERPRINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the worker kept trying a server whose certificate it refused");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = output(child.wait_with_output().unwrap());
    assert!(!status.success());
    assert!(out.stderr.contains("not the pinned"), "{}", out.stderr);
    let workers = server.cli().run(&["workers", "--json"]).success().json();
    assert_eq!(workers["workers"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_replica_presents_the_one_certificate_kept_in_the_database() {
    let db = testkit::fresh_database().await;
    let a = Server::start(&bin(), &db.url, ServerOptions::default());
    let b = Server::start(&bin(), &db.url, ServerOptions::default());
    assert!(a.fingerprint.is_some());
    assert_eq!(a.fingerprint, b.fingerprint);
    // One client pinned once reaches both.
    let both = Cli {
        url: format!("{},{}", a.url, b.url),
        ..a.cli()
    };
    both.run(&["jobs"]).success();
    Cli {
        url: b.url.clone(),
        ..a.cli()
    }
    .run(&["jobs"])
    .success();
    // What `up` wrote beside its data is that certificate.
    let pem = std::fs::read_to_string(b.certificate.as_ref().unwrap()).unwrap();
    let der = api::tls::certificate_chain(&pem).unwrap();
    assert_eq!(
        Some(client::Fingerprint::of(der[0].as_ref()).to_string()),
        a.fingerprint
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_given_certificate_and_key_are_presented_and_a_mismatched_pair_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["gpu-server.example".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let expected = client::Fingerprint::of(made.cert.der()).to_string();

    let args = |c: &std::path::Path, k: &std::path::Path| {
        vec![
            "--tls-cert".to_string(),
            c.display().to_string(),
            "--tls-key".to_string(),
            k.display().to_string(),
        ]
    };
    let server = server(ServerOptions {
        extra_args: args(&cert, &key),
        ..Default::default()
    })
    .await;
    assert_eq!(server.fingerprint.as_deref(), Some(expected.as_str()));
    server.cli().run(&["jobs"]).success();

    let other = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
    let other_key = dir.path().join("other-key.pem");
    std::fs::write(&other_key, other.signing_key.serialize_pem()).unwrap();
    let db = testkit::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let out = output(
        Command::new(bin())
            .args(["up", "--listen", "127.0.0.1:0", "--database-url", &db.url])
            .arg("--data-dir")
            .arg(data.path())
            .args(args(&cert, &other_key))
            .env("XDG_CONFIG_HOME", data.path().join("config"))
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    );
    one_line_error(&out, "cannot use --tls-cert/--tls-key");
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_needs_insecure_http_and_a_loopback_address() {
    let server = server(ServerOptions {
        extra_args: vec!["--insecure-http".into()],
        ..Default::default()
    })
    .await;
    assert!(server.url.starts_with("http://"), "{}", server.url);
    assert_eq!(server.fingerprint, None);
    server.cli().run(&["jobs"]).success();

    let db = testkit::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let out = output(
        Command::new(bin())
            .args(["up", "--insecure-http", "--listen", "0.0.0.0:0"])
            .args(["--database-url", &db.url])
            .arg("--data-dir")
            .arg(data.path())
            .env("XDG_CONFIG_HOME", data.path().join("config"))
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    );
    one_line_error(
        &out,
        "--insecure-http is allowed only on a loopback --listen address",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_stalled_mid_handshake_holds_up_nobody_else() {
    let server = server(ServerOptions::default()).await;
    let addr = server.url.trim_start_matches("https://").to_string();
    // Connections that never say a word, and one that sends half a TLS record.
    let mut stalled: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    std::io::Write::write_all(&mut half, &[0x16, 0x03, 0x01]).unwrap();
    stalled.push(half);
    let started = Instant::now();
    server.cli().run(&["jobs"]).success();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a call waited {:?} behind stalled handshakes",
        started.elapsed()
    );
    drop(stalled);
}
