//! Who is looking at the dashboard: a browser session opened by a one-time link
//! (`gpulayer dashboard`) or the login form, carried by an `HttpOnly`, `SameSite=Strict`
//! cookie (`Secure` over TLS) and acting with its token's role; CSRF values for every form.

use crate::auth::{Caller, Permission, mint_secret};
use crate::error::ApiError;
use crate::server::AppState;
use axum::extract::FromRequestParts;
use axum::http::header::{COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use std::time::Duration;

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "gpulayer_session";
/// The login form's CSRF cookie (before there is a session to hold the value).
pub(crate) const LOGIN_COOKIE: &str = "gpulayer_login";
/// How long a session lasts (never past its token's expiry).
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time login link works.
pub const LINK_TTL: Duration = Duration::from_secs(60);

/// A logged-in browser: the token it acts as and the CSRF value its forms must carry.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub caller: Caller,
    pub csrf: String,
}

impl Viewer {
    /// Whether this viewer may change jobs (read-only tokens are shown no such buttons).
    pub(crate) fn may_submit(&self) -> bool {
        self.caller.require(Permission::SubmitJobs).is_ok()
    }

    /// Refuses a form that does not carry this session's CSRF value.
    pub(crate) fn check_csrf(&self, given: &str) -> Result<(), ApiError> {
        if constant_time_eq(given.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "the form's CSRF value does not match this session; reload the page".into(),
            ))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request, if sent.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for the dashboard's paths: never readable by scripts, never sent
/// with requests from other sites, only over TLS when the server speaks it.
pub(crate) fn set_cookie(
    state: &AppState,
    name: &str,
    value: &str,
    max_age: Duration,
) -> HeaderValue {
    let secure = if state.config.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    ))
    .expect("cookie values are alphanumeric")
}

/// A request that changes state must come from the dashboard's own pages: an `Origin`
/// naming another host is refused (on top of the SameSite cookie and the CSRF value).
pub(crate) fn check_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(origin);
    if origin_host == host {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "a request from {origin} may not act on this dashboard"
        )))
    }
}

/// Opens a session for `token_id`: the response redirects to `to` with the cookie set.
pub(crate) async fn open_session(
    state: &AppState,
    token_id: i64,
    to: &str,
) -> Result<Response, ApiError> {
    let secret = mint_secret("gld_");
    let csrf = mint_secret("");
    state
        .store
        .create_dashboard_session(token_id, &secret, &csrf, SESSION_TTL)
        .await?;
    let mut response = Redirect::to(to).into_response();
    let headers = response.headers_mut();
    headers.append(
        SET_COOKIE,
        set_cookie(state, SESSION_COOKIE, &secret, SESSION_TTL),
    );
    headers.append(
        SET_COOKIE,
        set_cookie(state, LOGIN_COOKIE, "", Duration::ZERO),
    );
    Ok(response)
}

/// Where a page goes when nobody is logged in.
pub(crate) struct LoginFirst;

impl IntoResponse for LoginFirst {
    fn into_response(self) -> Response {
        Redirect::to("/dashboard/login").into_response()
    }
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(secret) = cookie(&parts.headers, SESSION_COOKIE).filter(|s| !s.is_empty()) else {
            return Err(LoginFirst.into_response());
        };
        let session = state
            .store
            .find_dashboard_session(secret)
            .await
            .map_err(|e| ApiError::from(e).into_response())?;
        let Some(session) = session else {
            return Err(LoginFirst.into_response());
        };
        let caller = Caller {
            token_id: session.token.id,
            name: session.token.name,
            role: session.token.role,
        };
        // Worker tokens cannot log in; a session whose token lost the right is turned away.
        caller
            .require(Permission::ReadJobs)
            .map_err(IntoResponse::into_response)?;
        Ok(Viewer {
            caller,
            csrf: session.csrf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_found_among_others_and_only_by_its_whole_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=1; gpulayer_session=s3cret; gpulayer_login=x"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("s3cret"));
        assert_eq!(cookie(&headers, "gpulayer"), None);
        assert_eq!(cookie(&headers, "a"), Some("1"));
    }

    #[test]
    fn only_a_form_from_this_host_may_change_anything() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:8470"));
        assert!(
            check_origin(&headers).is_ok(),
            "no Origin: same-origin forms may omit it"
        );
        headers.insert(ORIGIN, HeaderValue::from_static("https://127.0.0.1:8470"));
        assert!(check_origin(&headers).is_ok());
        headers.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert!(check_origin(&headers).is_err());
    }

    #[test]
    fn csrf_values_must_match_exactly() {
        let viewer = Viewer {
            caller: Caller {
                token_id: 1,
                name: "t".into(),
                role: store::Role::ReadOnly,
            },
            csrf: "abc".into(),
        };
        assert!(viewer.check_csrf("abc").is_ok());
        assert!(viewer.check_csrf("abd").is_err());
        assert!(viewer.check_csrf("").is_err());
        assert!(!viewer.may_submit());
    }
}
