//! `gpulayer dashboard`: opens the web dashboard in a browser, logged in through a one-time
//! link that works once, within a minute.

use anyhow::Result;
use clap::Args;
use std::process::{Command, Stdio};

#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Print the link instead of opening a browser.
    #[arg(long)]
    no_browser: bool,
    /// Print one JSON object (url, expires_in_seconds, opened) instead of prose.
    #[arg(long)]
    json: bool,
}

/// Browsers to try, first to last: `$BROWSER` (a person's own choice), then the desktop's
/// opener.
fn openers() -> Vec<String> {
    let mut list: Vec<String> = std::env::var("BROWSER")
        .ok()
        .map(|b| {
            b.split(':')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for opener in ["xdg-open", "open", "sensible-browser"] {
        list.push(opener.to_string());
    }
    list
}

/// Starts a browser on `url`; the one that started, if any did.
fn open_browser(url: &str) -> Option<String> {
    for opener in openers() {
        let started = Command::new(&opener)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = started {
            // An opener that fails at once (no display) did not open anything.
            std::thread::sleep(std::time::Duration::from_millis(300));
            match child.try_wait() {
                Ok(Some(status)) if !status.success() => continue,
                _ => return Some(opener),
            }
        }
    }
    None
}

pub(crate) async fn run(args: DashboardArgs) -> Result<()> {
    let client = crate::settings::client()?;
    let link = client.dashboard_link().await?;
    let url = format!("{}{}", client.url(), link.path);
    let opened = if args.no_browser {
        None
    } else {
        open_browser(&url)
    };
    if args.json {
        let out = serde_json::json!({
            "url": url,
            "expires_in_seconds": link.expires_in_seconds,
            "opened": opened.is_some(),
        });
        println!("{out}");
        return Ok(());
    }
    match opened {
        Some(by) => println!(
            "opened the dashboard with {by}; if no browser appeared, open this link (it works once, within {} s):\n  {url}",
            link.expires_in_seconds
        ),
        None => println!(
            "open this link in a browser (it works once, within {} s):\n  {url}",
            link.expires_in_seconds
        ),
    }
    if url.starts_with("https://") {
        println!(
            "  (the server's certificate is self-signed unless it was given one: the browser asks once whether to trust it; its fingerprint is GPULAYER_FINGERPRINT)"
        );
    }
    Ok(())
}
