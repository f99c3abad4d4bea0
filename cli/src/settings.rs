//! Client settings: `GPULAYER_URL` / `GPULAYER_TOKEN` / `GPULAYER_FINGERPRINT` (or
//! `--fingerprint`) first, then the config file that `gpulayer up` writes
//! (`$XDG_CONFIG_HOME/gpulayer/config.toml`, mode 0600).

use anyhow::{Context, Result, anyhow};
use client::{Client, ClientError, Fingerprint};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ConfigFile {
    pub url: Option<String>,
    pub token: Option<String>,
    /// The sha256 fingerprint of the certificate the server at `url` presents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// Where the token in use came from, to name it when the server rejects it.
static TOKEN_SOURCE: OnceLock<String> = OnceLock::new();
/// The `--fingerprint` given on the command line.
static FINGERPRINT_FLAG: OnceLock<String> = OnceLock::new();

/// Records the command line's `--fingerprint`, which comes before every other setting.
pub(crate) fn set_fingerprint_flag(fingerprint: &str) {
    let _ = FINGERPRINT_FLAG.set(fingerprint.to_string());
}

/// The fingerprint to pin: `given`, else `--fingerprint`, else `GPULAYER_FINGERPRINT`.
pub(crate) fn fingerprint_setting(given: Option<&str>) -> Result<Option<Fingerprint>> {
    let text = given
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .or_else(|| FINGERPRINT_FLAG.get().cloned())
        .or_else(|| {
            std::env::var("GPULAYER_FINGERPRINT")
                .ok()
                .filter(|s| !s.is_empty())
        });
    Ok(text.map(|t| Fingerprint::parse(&t)).transpose()?)
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

pub(crate) fn config_path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| home().join(".config"));
    base.join("gpulayer").join("config.toml")
}

pub(crate) fn default_data_dir() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| home().join(".local").join("share"));
    base.join("gpulayer")
}

pub(crate) fn read_config(path: &Path) -> Result<ConfigFile> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Writes the config file readable by its owner only (it holds a token).
pub(crate) fn write_config(path: &Path, config: &ConfigFile) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = toml::to_string(config).context("cannot encode the config")?;
    write_private(path, &text)
}

/// Writes a secret-bearing file as mode 0600, whole or not at all (a temporary file renamed
/// into place, so a crash never leaves half a token).
pub(crate) fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Names where the token in use came from, for `explain`.
pub(crate) fn set_token_source(source: &str) {
    let _ = TOKEN_SOURCE.set(source.to_string());
}

/// A client for the configured server.
pub(crate) fn client() -> Result<Client> {
    client_with(None, None, None)
}

/// A client for `url` with `token` and the certificate `fingerprint` where given, else as
/// configured.
pub(crate) fn client_with(
    url: Option<&str>,
    token: Option<&str>,
    fingerprint: Option<&str>,
) -> Result<Client> {
    let path = config_path();
    let given = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(str::to_string);
    let env_url =
        given(url).or_else(|| std::env::var("GPULAYER_URL").ok().filter(|s| !s.is_empty()));
    let env_token = given(token).or_else(|| {
        std::env::var("GPULAYER_TOKEN")
            .ok()
            .filter(|s| !s.is_empty())
    });
    let file = if env_url.is_some() && env_token.is_some() {
        ConfigFile::default()
    } else {
        read_config(&path)?
    };
    let url = env_url.or(file.url.clone()).ok_or_else(|| {
        anyhow!(
            "no server configured: run `gpulayer up` on this machine (it writes {}), or set GPULAYER_URL and GPULAYER_TOKEN",
            path.display()
        )
    })?;
    let (token, source) = match (env_token, file.token) {
        (Some(t), _) => (t, "GPULAYER_TOKEN".to_string()),
        (None, Some(t)) => (t, format!("`token` in {}", path.display())),
        (None, None) => {
            return Err(anyhow!(
                "no token configured for {url}: set GPULAYER_TOKEN, or `token` in {}",
                path.display()
            ));
        }
    };
    set_token_source(&source);
    // The config file's fingerprint belongs to the config file's server.
    let pin = match fingerprint_setting(fingerprint)? {
        Some(pin) => Some(pin),
        None if file.url.as_deref() == Some(url.as_str()) => file
            .fingerprint
            .as_deref()
            .map(Fingerprint::parse)
            .transpose()
            .with_context(|| format!("`fingerprint` in {}", path.display()))?,
        None => None,
    };
    Ok(Client::pinned(&url, Some(&token), pin)?)
}

/// The one-line message for an error, naming the setting to fix when the token was refused.
pub(crate) fn explain(e: &anyhow::Error) -> String {
    if let Some(ClientError::Unauthorized { url, message }) = e.downcast_ref::<ClientError>() {
        let source = TOKEN_SOURCE
            .get()
            .map(String::as_str)
            .unwrap_or("GPULAYER_TOKEN");
        return format!("the server at {url} rejected the token ({message}); fix {source}");
    }
    format!("{e:#}")
}
