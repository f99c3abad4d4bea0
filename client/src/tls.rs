//! How a client trusts the server: the sha256 fingerprint of the certificate it must present
//! (the self-signed one `gpulayer up` makes), or, with no fingerprint, the system's roots.

use crate::error::ClientError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};

/// The sha256 of a certificate's DER bytes, written `sha256:` and 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of one DER-encoded certificate.
    pub fn of(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }

    /// Reads `sha256:HEX`; also takes bare hex and the `AB:CD:...` form `openssl x509
    /// -fingerprint -sha256` prints, so a pasted fingerprint is not refused for its shape.
    pub fn parse(text: &str) -> Result<Self, ClientError> {
        let bad = |detail: &str| ClientError::BadFingerprint {
            given: text.to_string(),
            detail: detail.to_string(),
        };
        let trimmed = text.trim();
        let body = match trimmed.split_once(['=', ':']) {
            Some((algo, rest)) if algo.eq_ignore_ascii_case("sha256") => rest,
            Some((algo, _)) if algo.eq_ignore_ascii_case("sha256 fingerprint") => {
                trimmed.split_once('=').map(|(_, r)| r).unwrap_or_default()
            }
            _ => trimmed,
        };
        let hex_digits: String = body.chars().filter(|c| *c != ':').collect();
        if hex_digits.len() != 64 {
            return Err(bad("a sha256 fingerprint has 64 hex digits"));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(&hex_digits, &mut bytes).map_err(|_| bad("not hexadecimal"))?;
        Ok(Self(bytes))
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = ClientError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The crypto every TLS connection of ours uses (the provider object_store builds anyway).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Accepts exactly the certificate whose fingerprint is pinned, whatever name or issuer it
/// carries (as SSH accepts a known host key): a self-signed certificate made on a machine
/// with no public name is as good as any once its fingerprint is known. The last fingerprint
/// refused is kept so the error can name it.
#[derive(Debug)]
pub(crate) struct PinnedCertificate {
    pinned: Fingerprint,
    provider: Arc<CryptoProvider>,
    refused: Mutex<Option<Fingerprint>>,
}

impl PinnedCertificate {
    pub(crate) fn new(pinned: Fingerprint) -> Self {
        Self {
            pinned,
            provider: provider(),
            refused: Mutex::new(None),
        }
    }

    pub(crate) fn pinned(&self) -> Fingerprint {
        self.pinned
    }

    /// The fingerprint of the certificate refused since the last call, if one was.
    pub(crate) fn take_refused(&self) -> Option<Fingerprint> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of(end_entity.as_ref());
        if presented == self.pinned {
            return Ok(ServerCertVerified::assertion());
        }
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(presented);
        Err(rustls::Error::General(format!(
            "the server presented the certificate {presented}, not the pinned {}",
            self.pinned
        )))
    }

    // The handshake's signatures are still checked: whoever answers must hold the key of
    // the pinned certificate, not just a copy of the certificate.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A rustls client configuration that trusts only the pinned certificate, speaking
/// HTTP/1.1 (the websocket upgrade and every call we make need no more).
pub(crate) fn pinned_config(
    verifier: Arc<PinnedCertificate>,
) -> Result<rustls::ClientConfig, ClientError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A `reqwest` client that trusts only the certificate with `pinned` (for tests and tools
/// that make raw requests beside [`crate::Client`]).
pub fn pinned_reqwest(pinned: Fingerprint) -> Result<reqwest::Client, ClientError> {
    let config = pinned_config(Arc::new(PinnedCertificate::new(pinned)))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()
        .map_err(|e| ClientError::Tls(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_back_what_it_writes_and_the_openssl_form() {
        let fp = Fingerprint::of(b"certificate bytes");
        let written = fp.to_string();
        assert!(written.starts_with("sha256:") && written.len() == 7 + 64);
        assert_eq!(Fingerprint::parse(&written).unwrap(), fp);
        let hex = written.trim_start_matches("sha256:");
        assert_eq!(Fingerprint::parse(hex).unwrap(), fp);
        let openssl: Vec<String> = hex
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8_lossy(c).to_uppercase())
            .collect();
        let openssl = format!("SHA256 Fingerprint={}", openssl.join(":"));
        assert_eq!(Fingerprint::parse(&openssl).unwrap(), fp);
        assert_eq!(Fingerprint::parse(&format!("SHA256:{hex}")).unwrap(), fp);
    }

    #[test]
    fn a_fingerprint_of_the_wrong_shape_is_refused_with_the_reason() {
        let not_hex = format!("sha256:{}", "z".repeat(64));
        for (given, reason) in [
            ("sha256:abc", "64 hex digits"),
            (not_hex.as_str(), "hexadecimal"),
            ("", "64 hex digits"),
        ] {
            let err = Fingerprint::parse(given).unwrap_err().to_string();
            assert!(err.contains(reason), "{given}: {err}");
        }
    }
}
