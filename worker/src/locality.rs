//! Where a worker is, for placing multi-node jobs close together: its cloud zone from the
//! GCE metadata server when it runs on Google Cloud and was not given a `zone` label.
//!
//! The metadata server is asked only where it can exist — the machine's DMI product name says
//! "Google", or `GCE_METADATA_HOST` names it (as Google's own client libraries honour) — and
//! with a short timeout, so a worker elsewhere never waits for it. The region follows from
//! the zone (`domain::layout::Locality::of`).

use domain::layout::ZONE_LABEL;
use std::collections::BTreeMap;
use std::time::Duration;

/// Long enough for the link-local metadata server (answers in about a millisecond), short
/// enough that a worker on a machine that only looks like GCE starts without noticing.
const METADATA_TIMEOUT: Duration = Duration::from_millis(500);

/// The metadata server's well-known name.
const METADATA_HOST: &str = "metadata.google.internal";

/// `labels`, with `zone` filled in from the metadata server when it is missing and the
/// machine is on GCE. Any failure leaves the labels as they were (logged).
pub async fn with_cloud_zone(mut labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    if labels.contains_key(ZONE_LABEL) {
        return labels;
    }
    let Some(host) = metadata_host() else {
        return labels;
    };
    match gce_zone(&host, METADATA_TIMEOUT).await {
        Ok(zone) => {
            tracing::info!(%zone, "zone from the GCE metadata server");
            labels.insert(ZONE_LABEL.to_string(), zone);
        }
        Err(e) => tracing::warn!(error = %e, "no zone from the GCE metadata server"),
    }
    labels
}

/// The metadata server to ask, if this machine can have one.
fn metadata_host() -> Option<String> {
    if let Ok(host) = std::env::var("GCE_METADATA_HOST")
        && !host.is_empty()
    {
        return Some(host);
    }
    let product = std::fs::read_to_string("/sys/class/dmi/id/product_name").ok()?;
    product
        .contains("Google")
        .then(|| METADATA_HOST.to_string())
}

/// Asks the metadata server at `host` for this instance's zone.
pub async fn gce_zone(host: &str, timeout: Duration) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())?;
    let url = format!("http://{host}/computeMetadata/v1/instance/zone");
    let response = client
        .get(&url)
        .header("Metadata-Flavor", "Google")
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url}: HTTP {}", response.status()));
    }
    let body = response.text().await.map_err(|e| format!("{url}: {e}"))?;
    zone_of(&body).ok_or_else(|| format!("{url}: not a zone: {body:?}"))
}

/// The zone in the metadata server's answer, `projects/123456789/zones/europe-west4-a`.
fn zone_of(answer: &str) -> Option<String> {
    let zone = answer.trim().rsplit_once("/zones/")?.1;
    let valid = !zone.is_empty()
        && zone
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then(|| zone.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_zone_is_the_last_part_of_the_answer() {
        for (answer, zone) in [
            (
                "projects/123456789/zones/europe-west4-a",
                Some("europe-west4-a"),
            ),
            ("projects/1/zones/us-central1-f\n", Some("us-central1-f")),
            ("europe-west4-a", None),
            ("projects/1/zones/", None),
            ("<html>captive portal</html>", None),
        ] {
            assert_eq!(zone_of(answer).as_deref(), zone, "{answer}");
        }
    }

    /// A recorded-protocol double of the GCE metadata server: it answers the zone only to
    /// requests that carry `Metadata-Flavor: Google`, as the real one does (403 otherwise).
    async fn metadata_double() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = conn.read(&mut buf).await.unwrap();
                let request = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                let ok = request.starts_with("get /computemetadata/v1/instance/zone ")
                    && request.contains("metadata-flavor: google");
                let (status, body) = if ok {
                    ("200 OK", "projects/123456789/zones/europe-west4-a")
                } else {
                    ("403 Forbidden", "Missing Metadata-Flavor:Google header.")
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nMetadata-Flavor: Google\r\nContent-Type: application/text\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_zone_comes_from_the_metadata_server() {
        let host = metadata_double().await;
        assert_eq!(
            gce_zone(&host, METADATA_TIMEOUT).await.unwrap(),
            "europe-west4-a"
        );
    }

    #[tokio::test]
    async fn a_silent_metadata_server_costs_only_the_timeout() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let started = std::time::Instant::now();
        let err = gce_zone(&host, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        drop(listener);
    }

    #[tokio::test]
    async fn a_zone_label_given_is_kept() {
        let labels = BTreeMap::from([(ZONE_LABEL.to_string(), "mine-1-a".to_string())]);
        assert_eq!(with_cloud_zone(labels.clone()).await, labels);
    }
}
