//! Store URLs without their passwords, for messages and logs.

use crate::StoreError;

/// The password of `scheme://user:password@host…`, as written and percent-decoded; the
/// userinfo ends at the last `@`, as URL parsers read it. Works on malformed URLs too,
/// which are the ones that end up in error messages.
fn passwords(url: &str) -> Vec<String> {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return Vec::new();
    };
    let rest = &url[start..];
    let Some(at) = rest.rfind('@') else {
        return Vec::new();
    };
    let Some(colon) = rest[..at].find(':') else {
        return Vec::new();
    };
    let raw = &rest[colon + 1..at];
    if raw.is_empty() {
        return Vec::new();
    }
    let decoded = percent_decode(raw);
    if decoded == raw {
        vec![raw.to_string()]
    } else {
        vec![raw.to_string(), decoded]
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with its password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    redact(url, url)
}

/// `text` with every occurrence of `url`'s password replaced by `***`.
pub fn redact(text: &str, url: &str) -> String {
    let mut text = text.to_string();
    // longest first: the decoded form may be a part of the raw one or the other way round
    let mut secrets = passwords(url);
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        text = text.replace(&secret, "***");
    }
    text
}

pub(crate) fn without_password(err: StoreError, url: &str) -> StoreError {
    let text = err.to_string();
    let masked = redact(&text, url);
    if masked == text {
        err
    } else {
        StoreError::Redacted(masked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_masked_even_when_malformed() {
        for (url, masked) in [
            (
                "postgres://app:s3cr%40t@db:5432/q?sslmode=require",
                "postgres://app:***@db:5432/q?sslmode=require",
            ),
            ("mysql://app:p@ss@db/q", "mysql://app:***@db/q"),
            (
                "postgress://app:pw@db:notaport/q",
                "postgress://app:***@db:notaport/q",
            ),
            ("mysql://app@db/q", "mysql://app@db/q"),
            ("sqlite://asyncd.db", "sqlite://asyncd.db"),
            ("not a url at all", "not a url at all"),
        ] {
            assert_eq!(redact_url(url), masked, "{url}");
        }
        // the decoded form, as a driver would quote it, is masked too
        let url = "postgres://app:s3cr%40t@db/q";
        assert_eq!(redact("auth as s3cr@t failed", url), "auth as *** failed");
    }
}
