//! The executor call signature (`docs/security.md`, "Signed executor calls").
//!
//! The signed bytes are the call's headers, verbatim, and then its body, joined by LF
//! (`\n`, 0x0A):
//!
//! ```text
//! <Asyncd-Timestamp>\n<Asyncd-Task-Id>\n<Asyncd-Attempt>\n<Idempotency-Key>\n
//! <Asyncd-Lease-Token>\n<Asyncd-Callback-Url>\n<body>
//! ```
//!
//! No header value can hold an LF, so the fields cannot run into each other; the body,
//! which may, comes last. `Asyncd-Signature` is `v2=<lowercase hex HMAC-SHA256(key,
//! signed bytes)>`, once per signing key, comma-separated: while a key is rotated the
//! dispatcher signs with both, and a verifier accepts the call when any of its keys
//! matches any of the values.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far `Asyncd-Timestamp` may be from the verifier's clock; beyond it a captured
/// call is refused, and within it a verifier refuses the same (task, attempt) twice.
pub const SIGNATURE_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The prefix of each value in `Asyncd-Signature`.
pub const SIGNATURE_SCHEME: &str = "v2=";

/// The signed parts of one executor call: header values exactly as sent, and the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedCall<'a> {
    pub timestamp: &'a str,
    pub task_id: &'a str,
    pub attempt: &'a str,
    pub idempotency_key: &'a str,
    pub lease_token: &'a str,
    pub callback_url: &'a str,
    pub body: &'a [u8],
}

impl SignedCall<'_> {
    /// The bytes the HMAC covers.
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.body.len());
        for field in [
            self.timestamp,
            self.task_id,
            self.attempt,
            self.idempotency_key,
            self.lease_token,
            self.callback_url,
        ] {
            out.extend_from_slice(field.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(self.body);
        out
    }
}

/// Why an executor call's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("bad signature: missing or malformed Asyncd-Timestamp")]
    MalformedTimestamp,
    #[error("bad signature: timestamp more than 5 minutes off")]
    Stale,
    #[error("bad signature: signature mismatch")]
    Mismatch,
    #[error("bad signature: no signing key configured")]
    NoKey,
}

fn mac(key: &[u8], call: &SignedCall) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any size");
    mac.update(&call.canonical());
    mac
}

/// The `Asyncd-Signature` value of `call`: one `v2=` value per key, in the order given
/// (the primary key first), comma-separated. Refuses an empty key list or an empty key:
/// a signature anyone could compute is never sent.
pub fn sign(keys: &[&[u8]], call: &SignedCall) -> Result<String, SignatureError> {
    if keys.is_empty() || keys.iter().any(|k| k.is_empty()) {
        return Err(SignatureError::NoKey);
    }
    Ok(keys
        .iter()
        .map(|key| {
            format!(
                "{SIGNATURE_SCHEME}{}",
                hex::encode(mac(key, call).finalize().into_bytes())
            )
        })
        .collect::<Vec<_>>()
        .join(","))
}

/// Checks an executor call's `Asyncd-Signature` against `keys` (one, or two while a key
/// is rotated; empty keys are ignored) at time `now`: the timestamp must be within
/// [`SIGNATURE_TOLERANCE`] and one of the `v2=` values must match one of the keys. The
/// comparison is constant-time. Replays within the window are the caller's to refuse
/// (the SDKs keep the (task, attempt) pairs they have seen).
pub fn verify_signature(
    keys: &[&[u8]],
    signature: Option<&str>,
    call: &SignedCall,
    now: SystemTime,
) -> Result<(), SignatureError> {
    let keys: Vec<&[u8]> = keys.iter().copied().filter(|k| !k.is_empty()).collect();
    if keys.is_empty() {
        return Err(SignatureError::NoKey);
    }
    let ts: i64 = call
        .timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::MalformedTimestamp)?;
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    if (now - ts as f64).abs() > SIGNATURE_TOLERANCE.as_secs_f64() {
        return Err(SignatureError::Stale);
    }
    let sent: Vec<Vec<u8>> = signature
        .unwrap_or("")
        .split(',')
        .filter_map(|part| part.trim().strip_prefix(SIGNATURE_SCHEME))
        .filter_map(|hex_sig| hex::decode(hex_sig).ok())
        .collect();
    let matched = keys.iter().any(|key| {
        let expected = mac(key, call);
        sent.iter()
            .any(|sig| expected.clone().verify_slice(sig).is_ok())
    });
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(body: &[u8]) -> SignedCall<'_> {
        SignedCall {
            timestamp: "1700000000",
            task_id: "t1",
            attempt: "1",
            idempotency_key: "k1",
            lease_token: "tok",
            callback_url: "http://asyncd:7700",
            body,
        }
    }

    #[test]
    fn canonical_bytes_are_the_documented_layout() {
        assert_eq!(
            call(b"{}\n").canonical(),
            b"1700000000\nt1\n1\nk1\ntok\nhttp://asyncd:7700\n{}\n"
        );
    }

    #[test]
    fn known_vector_computed_with_openssl() {
        // printf '1700000000\nt1\n1\nk1\ntok\nhttp://asyncd:7700\n{}' \
        //   | openssl dgst -sha256 -hmac secret
        assert_eq!(
            sign(&[b"secret"], &call(b"{}")).unwrap(),
            "v2=cd88cff69ddbc13aa5456dcec7bb570ba5b8bf34c7bd1cc5e47a2821be952234"
        );
    }

    #[test]
    fn never_signs_without_a_key() {
        assert_eq!(sign(&[], &call(b"{}")), Err(SignatureError::NoKey));
        assert_eq!(sign(&[b""], &call(b"{}")), Err(SignatureError::NoKey));
        assert_eq!(sign(&[b"k", b""], &call(b"{}")), Err(SignatureError::NoKey));
    }

    #[test]
    fn verify_cases() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let body = br#"{"id":"t1"}"#;
        let both = sign(&[b"new", b"old"], &call(body)).unwrap();
        let old = sign(&[b"old"], &call(body)).unwrap();
        let verify = |keys: &[&[u8]], sig: &str, c: SignedCall, at: SystemTime| {
            verify_signature(keys, Some(sig), &c, at)
        };
        assert_eq!(verify(&[b"new"], &both, call(body), now), Ok(()));
        assert_eq!(verify(&[b"old"], &both, call(body), now), Ok(()));
        assert_eq!(verify(&[b"new", b"old"], &old, call(body), now), Ok(()));
        assert_eq!(
            verify(&[b"new"], &old, call(body), now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&[b"", b""], &old, call(body), now),
            Err(SignatureError::NoKey)
        );
        let later = now + Duration::from_secs(301);
        assert_eq!(
            verify(&[b"old"], &old, call(body), later),
            Err(SignatureError::Stale)
        );
        // Every signed field matters.
        let mut other = call(body);
        other.lease_token = "tok2";
        assert_eq!(
            verify(&[b"old"], &old, other, now),
            Err(SignatureError::Mismatch)
        );
        let mut other = call(body);
        other.callback_url = "http://evil";
        assert_eq!(
            verify(&[b"old"], &old, other, now),
            Err(SignatureError::Mismatch)
        );
        let mut other = call(body);
        other.timestamp = "soon";
        assert_eq!(
            verify(&[b"old"], &old, other, now),
            Err(SignatureError::MalformedTimestamp)
        );
        let bare = old.trim_start_matches(SIGNATURE_SCHEME).to_string();
        assert_eq!(
            verify(&[b"old"], &bare, call(body), now),
            Err(SignatureError::Mismatch)
        );
        let v1 = format!("v1={bare}");
        assert_eq!(
            verify(&[b"old"], &v1, call(body), now),
            Err(SignatureError::Mismatch)
        );
    }
}
