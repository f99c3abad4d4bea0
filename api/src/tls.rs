//! The HTTPS listener: TCP connections whose TLS handshakes run beside the accept loop (a
//! client that stalls mid-handshake holds up nobody else), and the server's TLS settings.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A handshake not done in this long is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate PEM holds no certificate")]
    NoCertificate,
    #[error("cannot read the certificate PEM: {0}")]
    Certificate(String),
    #[error("cannot read the private key PEM: {0}")]
    Key(String),
    #[error("the certificate and key do not go together: {0}")]
    Mismatch(String),
}

/// The server's TLS settings for a PEM certificate chain (leaf first) and PEM private key;
/// HTTP/1.1 over it.
pub fn server_config(
    certificate_pem: &str,
    private_key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificate_chain(certificate_pem)?;
    let key = PrivateKeyDer::from_pem_slice(private_key_pem.as_bytes())
        .map_err(|e| TlsError::Key(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Mismatch(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Mismatch(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The DER certificates of a PEM chain, leaf first.
pub fn certificate_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(chain)
}

/// Accepts TCP connections and hands the server those whose TLS handshake succeeded.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // TLS records are small writes; Nagle would hold each behind a delayed ACK.
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if speaks_plain_http(&stream).await {
                        answer_plain_http(stream, local).await;
                        return;
                    }
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            accepting,
        })
    }
}

/// Whether the client's first byte starts a plain HTTP request rather than a TLS handshake
/// (whose first record is a handshake, type 22).
async fn speaks_plain_http(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await,
        Ok(Ok(1)) if first[0].is_ascii_uppercase()
    )
}

/// Tells a plain-HTTP client, in plain HTTP, to use https (a client pointed at http:// gets
/// an error it can act on, not a dropped connection it would retry forever).
async fn answer_plain_http(mut stream: TcpStream, local: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({
        "code": "bad_request",
        "message": format!(
            "this server speaks HTTPS: use https://{local} (and pin the certificate fingerprint `gpulayer up` printed)"
        ),
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // Read the request first: closing with unread bytes would reset the connection and
    // lose the answer.
    let mut request = [0u8; 8192];
    let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut request)).await;
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop never ends on its own; while it is gone, nothing arrives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
