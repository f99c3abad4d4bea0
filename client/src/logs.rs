//! Following a job's logs over the websocket. On a dropped connection the follower
//! reconnects and skips the lines it already has, so a line is shown once and none is lost.

use crate::error::ClientError;
use crate::http::Client;
use futures_util::StreamExt;
use protocol::{LogLine, LogStreamMessage};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// How long the follower keeps trying to reconnect to a server that went away.
const RECONNECT_FOR: Duration = Duration::from_secs(120);

impl Client {
    /// Calls `on_line` for every line of the job, live, until the job ends; returns the end
    /// message (state, exit code, reason).
    pub async fn follow_logs(
        &self,
        id: i64,
        on_line: impl FnMut(&LogLine),
    ) -> Result<LogStreamMessage, ClientError> {
        self.follow_rank_logs(id, None, on_line).await
    }

    /// `follow_logs` for the lines of process `rank` only (all with None).
    pub async fn follow_rank_logs(
        &self,
        id: i64,
        rank: Option<u32>,
        mut on_line: impl FnMut(&LogLine),
    ) -> Result<LogStreamMessage, ClientError> {
        let mut seen: HashMap<(i64, i32), i64> = HashMap::new();
        let mut failing_since: Option<tokio::time::Instant> = None;
        loop {
            let tried = self.url().to_string();
            match self.follow_once(id, rank, &mut seen, &mut on_line).await {
                Ok(end) => return Ok(end),
                Err(e) if e.is_transient() => {
                    self.fail_over(&tried);
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > RECONNECT_FOR {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn follow_once(
        &self,
        id: i64,
        rank: Option<u32>,
        seen: &mut HashMap<(i64, i32), i64>,
        on_line: &mut impl FnMut(&LogLine),
    ) -> Result<LogStreamMessage, ClientError> {
        let ws_url = format!(
            "{}/v1/jobs/{id}/logs/ws{}",
            self.url()
                .replacen("http://", "ws://", 1)
                .replacen("https://", "wss://", 1),
            rank.map(|r| format!("?rank={r}")).unwrap_or_default()
        );
        let unreachable = |detail: String| ClientError::Unreachable {
            url: self.url().to_string(),
            detail,
        };
        let mut request = ws_url
            .as_str()
            .into_client_request()
            .map_err(|e| unreachable(e.to_string()))?;
        if let Some(t) = self.token() {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| ClientError::Unauthorized {
                    url: self.url().to_string(),
                    message: "the token has characters a header cannot carry".into(),
                })?;
            request.headers_mut().insert("authorization", value);
        }
        let connector = match self.pin() {
            Some(pin) => Some(tokio_tungstenite::Connector::Rustls(Arc::new(
                crate::tls::pinned_config(pin.clone())?,
            ))),
            None => None,
        };
        let connected =
            tokio_tungstenite::connect_async_tls_with_config(request, None, false, connector).await;
        let (mut socket, _) = match connected {
            Ok(ok) => ok,
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                // The server refused the upgrade with an error body: surface it as the REST
                // call would (401, 404 ...).
                let status = resp.status().as_u16();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).to_string())
                    .unwrap_or_default();
                let parsed: Option<protocol::ErrorBody> = serde_json::from_str(&body).ok();
                let message = parsed.as_ref().map(|b| b.message.clone()).unwrap_or(body);
                if status == 401 {
                    return Err(ClientError::Unauthorized {
                        url: self.url().to_string(),
                        message,
                    });
                }
                return Err(ClientError::Api {
                    status,
                    code: parsed
                        .map(|b| b.code)
                        .unwrap_or(protocol::ErrorCode::Internal),
                    message,
                });
            }
            Err(e) => return Err(self.connection_failed(e.to_string())),
        };
        while let Some(msg) = socket.next().await {
            let msg = msg.map_err(|e| unreachable(e.to_string()))?;
            let text = match msg {
                Message::Text(t) => t,
                Message::Close(_) => break,
                _ => continue,
            };
            let parsed: LogStreamMessage =
                serde_json::from_str(&text).map_err(|e| ClientError::Protocol {
                    url: self.url().to_string(),
                    detail: format!("bad log message: {e}"),
                })?;
            match parsed {
                LogStreamMessage::Line(line) => {
                    let key = (line.task.0, line.attempt.0);
                    if seen.get(&key).is_some_and(|&s| line.seq <= s) {
                        continue;
                    }
                    seen.insert(key, line.seq);
                    on_line(&line);
                }
                end @ LogStreamMessage::End { .. } => return Ok(end),
            }
        }
        Err(unreachable(
            "the log stream closed before the job ended".into(),
        ))
    }
}
