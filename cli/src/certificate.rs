//! The certificate `gpulayer up` presents: the one given with --tls-cert/--tls-key, else a
//! self-signed one made on the first start and kept in the database, so every replica of a
//! control plane presents the same certificate and one pinned fingerprint fits them all.

use anyhow::{Context, Result, bail};
use client::Fingerprint;
use std::path::Path;
use store::{ServerCertificate, Store};

/// The certificate to present and its fingerprint.
pub(crate) struct Identity {
    pub certificate: ServerCertificate,
    pub fingerprint: Fingerprint,
    pub config: std::sync::Arc<rustls::ServerConfig>,
}

/// Reads `--tls-cert`/`--tls-key`, or the kept certificate (making it if there is none).
pub(crate) async fn identity(
    store: &Store,
    given: Option<(&Path, &Path)>,
    names: &[String],
) -> Result<Identity> {
    let certificate = match given {
        Some((cert, key)) => ServerCertificate {
            certificate_pem: std::fs::read_to_string(cert)
                .with_context(|| format!("cannot read --tls-cert {}", cert.display()))?,
            private_key_pem: std::fs::read_to_string(key)
                .with_context(|| format!("cannot read --tls-key {}", key.display()))?,
        },
        None => match store.server_certificate().await? {
            Some(kept) => kept,
            None => store.keep_server_certificate(&self_signed(names)?).await?,
        },
    };
    let what = if given.is_some() {
        "--tls-cert/--tls-key"
    } else {
        "the certificate kept in the database"
    };
    let chain = api::tls::certificate_chain(&certificate.certificate_pem)
        .with_context(|| format!("{what} is not a PEM certificate"))?;
    let config =
        api::tls::server_config(&certificate.certificate_pem, &certificate.private_key_pem)
            .with_context(|| format!("cannot use {what}"))?;
    Ok(Identity {
        fingerprint: Fingerprint::of(chain[0].as_ref()),
        certificate,
        config,
    })
}

/// A new self-signed certificate (ECDSA P-256) for `names` (host names and addresses).
/// Clients pin it by fingerprint, so its names matter only to tools that check them
/// (`curl --cacert`).
fn self_signed(names: &[String]) -> Result<ServerCertificate> {
    let mut names: Vec<String> = names.to_vec();
    names.dedup();
    if names.is_empty() {
        bail!("no name to put in the certificate");
    }
    let made = rcgen::generate_simple_self_signed(names.clone())
        .or_else(|_| {
            // A host name a certificate cannot carry: the loopback names still can.
            rcgen::generate_simple_self_signed(vec![
                "localhost".to_string(),
                "127.0.0.1".to_string(),
            ])
        })
        .context("cannot make a self-signed certificate")?;
    Ok(ServerCertificate {
        certificate_pem: made.cert.pem(),
        private_key_pem: made.signing_key.serialize_pem(),
    })
}
