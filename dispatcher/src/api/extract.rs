//! Path and query extractors that refuse bad parameters with the API's JSON error
//! ([`ApiError`]) naming the parameter. axum's own answer a path that is not UTF-8
//! (`/v1/tasks/%FF`) with a plain-text 400, and pass a NUL through: PostgreSQL refuses
//! a NUL in text, so `GET /v1/tasks/%00` answered 503 `store_unavailable` there (and 404
//! on SQLite). No name, id or key the API knows contains a NUL or is not UTF-8, so both
//! are refused before a handler runs, alike on every store.

use std::borrow::Cow;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// `axum::extract::Path`, refusing with a JSON 400 naming the parameter.
pub struct Path<T>(pub T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::field("path", rejection.body_text()))?;
        for (name, value) in &raw {
            if value.contains('\0') {
                return Err(ApiError::field(name, "must not contain NUL"));
            }
        }
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::field("path", rejection.body_text()))?;
        Ok(Self(value))
    }
}

/// `axum::extract::Query`, refusing a parameter that is not UTF-8 once decoded or that
/// holds a NUL (axum would have read `%FF` as U+FFFD and kept the NUL) with a JSON 400
/// naming it.
pub struct Query<T>(pub T);

impl<S, T> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        check_query(parts.uri.query().unwrap_or_default())?;
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state)
                .await
                .map_err(|rejection| ApiError::field("query", rejection.body_text()))?;
        Ok(Self(value))
    }
}

/// Refuses the first name or value of `query` that is not UTF-8 text without NUL.
fn check_query(query: &str) -> Result<(), ApiError> {
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name);
        let field = match std::str::from_utf8(&name) {
            Ok(name) if !name.contains('\0') => Cow::Borrowed(name),
            _ => {
                return Err(ApiError::field(
                    "query",
                    "a parameter name is not UTF-8 text without NUL",
                ));
            }
        };
        match std::str::from_utf8(&decode(value)) {
            Ok(value) if value.contains('\0') => {
                return Err(ApiError::field(field, "must not contain NUL"));
            }
            Ok(_) => {}
            Err(_) => return Err(ApiError::field(field, "must be UTF-8 text")),
        }
    }
    Ok(())
}

/// A query component as `application/x-www-form-urlencoded` reads it: `+` is a space,
/// `%XY` a byte; a `%` not followed by two hex digits stands for itself.
fn decode(component: &str) -> Vec<u8> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| hex_pair(*bytes.get(i + 1)?, *bytes.get(i + 2)?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, byte) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

fn hex_pair(high: u8, low: u8) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(high)? * 16 + digit(low)?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(query: &str) -> Option<String> {
        check_query(query).err().and_then(|err| err.error.field)
    }

    #[test]
    fn a_query_parameter_must_be_utf8_without_nul() {
        assert!(check_query("job=a&state=dead&x=%C3%A9+b&").is_ok());
        assert_eq!(refused_field("job=a&cursor=%FF").as_deref(), Some("cursor"));
        assert_eq!(refused_field("job=a%00b").as_deref(), Some("job"));
        assert_eq!(refused_field("job=%C3%28").as_deref(), Some("job"));
        assert_eq!(refused_field("%FF=x").as_deref(), Some("query"));
        // A lone `%` stands for itself, as axum reads it.
        assert!(check_query("job=100%&x=%4").is_ok());
    }
}
