//! `gpulayer token create|list|revoke`: tokens for people, CI and agents (admin tokens only).

use crate::table;
use anyhow::{Result, bail};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token; its secret is printed this once.
    Create(CreateArgs),
    /// List tokens (never their secrets).
    List(ListArgs),
    /// Revoke a token by id or name: refused from then on (within seconds on every replica).
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// admin, submitter (submit, read and cancel jobs), read-only, or worker (join machines).
    #[arg(long)]
    role: String,
    /// What it is for (letters, digits, '.', '_', '-'); every job it submits shows it.
    #[arg(long)]
    name: String,
    /// Stop working after this long: 90s, 15m, 12h, 30d [default: until revoked].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    expires: Option<i64>,
    /// Print JSON (the secret included).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Also revoked and expired tokens.
    #[arg(long)]
    all: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The token's id, or its name when one live token has it.
    token: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `90s`, `15m`, `12h`, `30d` or a number of seconds.
fn parse_duration(s: &str) -> Result<i64, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a duration: use 90s, 15m, 12h or 30d"))?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("'{s}' is not a duration: use 90s, 15m, 12h or 30d")),
    };
    match n.checked_mul(unit) {
        Some(secs) if secs > 0 => Ok(secs),
        _ => Err(format!("'{s}' is not a positive duration")),
    }
}

pub(crate) async fn run(args: TokenArgs) -> Result<()> {
    let client = crate::settings::client()?;
    match args.command {
        TokenCommand::Create(a) => {
            let created = client
                .create_token(&protocol::CreateTokenRequest {
                    name: a.name,
                    role: a.role,
                    expires_in_seconds: a.expires,
                })
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&created)?);
            } else {
                // The secret alone on stdout (`T=$(gpulayer token create ...)`), the rest for
                // the person reading.
                println!("{}", created.secret);
                let t = &created.token;
                let expires = t
                    .expires_at
                    .map(|at| format!(", expires {}", at.to_rfc3339()))
                    .unwrap_or_default();
                eprintln!(
                    "token {} '{}' ({}{expires}): the secret above is shown this once",
                    t.id, t.name, t.role
                );
            }
        }
        TokenCommand::List(a) => {
            let list = client.tokens(a.all).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        t.id.to_string(),
                        t.name.clone(),
                        t.role.clone(),
                        t.state.clone(),
                        table::ago(t.created_at),
                        t.expires_at
                            .map(|at| at.format("%Y-%m-%d %H:%M").to_string())
                            .unwrap_or_else(|| "-".into()),
                        t.jobs.to_string(),
                        t.created_by.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            table::print(
                &[
                    "ID", "NAME", "ROLE", "STATE", "CREATED", "EXPIRES", "JOBS", "BY",
                ],
                &rows,
            );
        }
        TokenCommand::Revoke(a) => {
            let id = match a.token.parse::<i64>() {
                Ok(id) => id,
                Err(_) => {
                    let list = client.tokens(false).await?;
                    let named: Vec<_> = list.tokens.iter().filter(|t| t.name == a.token).collect();
                    match named.as_slice() {
                        [one] => one.id,
                        [] => bail!(
                            "no live token is named '{}' (see `gpulayer token list`)",
                            a.token
                        ),
                        many => bail!(
                            "{} live tokens are named '{}' (ids {}): revoke one by id",
                            many.len(),
                            a.token,
                            many.iter()
                                .map(|t| t.id.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                }
            };
            let t = client.revoke_token(id).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                println!("revoked token {} '{}' ({})", t.id, t.name, t.role);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_a_number_and_a_unit() {
        for (s, secs) in [
            ("90s", 90),
            ("15m", 900),
            ("12h", 43_200),
            ("30d", 2_592_000),
            ("42", 42),
        ] {
            assert_eq!(parse_duration(s), Ok(secs), "{s}");
        }
        for bad in [
            "",
            "0",
            "0d",
            "d",
            "1w",
            "1.5h",
            "-3m",
            "99999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
