//! Signed Kafka messages (`--kafka-signing-key-file`, `ASYNCD_KAFKA_SIGNING_KEY`): the API
//! signs each message it produces, and a dispatcher given the key takes only messages
//! signed with it, so that a principal which may write a job's topic but does not hold the
//! key cannot enqueue (docs/security.md, "Signed Kafka messages").
//!
//! The `asyncd-signature` header is `v1=<lowercase hex HMAC-SHA256(key, signed bytes)>`,
//! the signed bytes being
//!
//! ```text
//! asyncd-kafka-v1\n<topic>\n<message value>
//! ```
//!
//! The topic is signed so that a message captured from one topic cannot be replayed into
//! another (another job's, or the same job's high-priority topic). Kafka topic names hold
//! no LF, so the topic cannot run into the value. The message key and other headers are
//! not signed: the consumer reads nothing from them.
//!
//! Keys are a list: the first signs, every one verifies, so a key is rotated by adding
//! the new one second on the dispatchers, then first on the API, then removing the old.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The Kafka message header carrying the signature.
pub const SIGNATURE_HEADER: &str = "asyncd-signature";

/// The prefix of the header's value: the scheme of the signed bytes.
const SCHEME: &str = "v1=";

/// What precedes the topic in the signed bytes, so that a signature over these bytes is
/// never also a valid HMAC of some other asyncd format under the same key.
const DOMAIN: &[u8] = b"asyncd-kafka-v1\n";

/// Shortest key taken: 32 bytes, the HMAC-SHA256 output size, e.g. `openssl rand -hex 32`
/// (64 characters).
pub const MIN_KEY_BYTES: usize = 32;

/// The keys Kafka messages are signed and verified with: never empty, none shorter than
/// [`MIN_KEY_BYTES`]. `Debug` shows how many there are, never a key.
#[derive(Clone, PartialEq, Eq)]
pub struct MessageKeys(Vec<Vec<u8>>);

impl fmt::Debug for MessageKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageKeys({} key(s), redacted)", self.0.len())
    }
}

/// Why a key list is refused; the caller names where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("holds no key")]
    Empty,
    #[error(
        "key {position} is {len} bytes; a Kafka signing key must be at least {MIN_KEY_BYTES} \
         (e.g. `openssl rand -hex 32`)"
    )]
    TooShort { position: usize, len: usize },
}

/// Why a consumed message's signature is refused; the text starts with the reason its
/// dead letter is counted under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "unsigned: the message has no {SIGNATURE_HEADER} header, and this dispatcher takes \
         only messages signed with its Kafka signing key"
    )]
    Unsigned,
    #[error(
        "bad signature: no {SIGNATURE_HEADER} header of the message signs its value for \
         topic {0:?} with a Kafka signing key of this dispatcher"
    )]
    Mismatch(String),
}

impl MessageKeys {
    /// The keys in `text`, separated by line breaks or commas, each trimmed of
    /// whitespace (so a file's final newline is no part of a key); blank entries are
    /// skipped. The first signs.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let keys: Vec<Vec<u8>> = text
            .split([',', '\n'])
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .map(|key| key.as_bytes().to_vec())
            .collect();
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some((index, key)) = keys
            .iter()
            .enumerate()
            .find(|(_, key)| key.len() < MIN_KEY_BYTES)
        {
            return Err(KeyError::TooShort {
                position: index + 1,
                len: key.len(),
            });
        }
        Ok(Self(keys))
    }

    fn mac(key: &[u8], topic: &str, value: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any size");
        mac.update(DOMAIN);
        mac.update(topic.as_bytes());
        mac.update(b"\n");
        mac.update(value);
        mac
    }

    /// The `asyncd-signature` header value of `value` produced to `topic`, with the first
    /// key.
    pub fn sign(&self, topic: &str, value: &[u8]) -> String {
        let mac = Self::mac(&self.0[0], topic, value);
        format!("{SCHEME}{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Whether one of `headers` (the message's `asyncd-signature` values; a message may
    /// repeat a header) signs `value` for `topic` with one of the keys. The comparison is
    /// constant-time (`Mac::verify_slice`).
    pub fn verify<'a>(
        &self,
        topic: &str,
        value: &[u8],
        headers: impl IntoIterator<Item = Option<&'a [u8]>>,
    ) -> Result<(), SignatureError> {
        let mut sent = Vec::new();
        let mut present = false;
        for header in headers {
            present = true;
            let Some(text) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
                continue;
            };
            if let Some(bytes) = text
                .trim()
                .strip_prefix(SCHEME)
                .and_then(|hex| hex::decode(hex).ok())
            {
                sent.push(bytes);
            }
        }
        if !present {
            return Err(SignatureError::Unsigned);
        }
        let matched = self.0.iter().any(|key| {
            let expected = Self::mac(key, topic, value);
            sent.iter()
                .any(|signature| expected.clone().verify_slice(signature).is_ok())
        });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch(topic.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "0123456789abcdef0123456789abcdef-old";
    const NEW: &str = "fedcba9876543210fedcba9876543210-new";
    const VALUE: &[u8] = br#"{"id":"t1","type":"work","payload":{}}"#;

    fn keys(text: &str) -> MessageKeys {
        MessageKeys::parse(text).unwrap()
    }

    fn check(
        keys: &MessageKeys,
        topic: &str,
        value: &[u8],
        header: &str,
    ) -> Result<(), SignatureError> {
        keys.verify(topic, value, [Some(header.as_bytes())])
    }

    /// The scheme as documented, so that a producer outside asyncd (or a person with
    /// openssl) can compute it:
    /// `printf 'asyncd-kafka-v1\norders\n{"id":"t1","type":"work","payload":{}}' |
    ///   openssl dgst -sha256 -hmac 0123456789abcdef0123456789abcdef-old`
    #[test]
    fn the_signature_is_hmac_sha256_over_the_domain_the_topic_and_the_value() {
        assert_eq!(
            keys(OLD).sign("orders", VALUE),
            "v1=5b5c1679b82e3bdc2d92e873fb8455b100e36af51bd542267f6518086f75d0aa"
        );
    }

    #[test]
    fn a_signed_value_verifies_and_a_tampered_one_does_not() {
        let keys = keys(OLD);
        let header = keys.sign("orders", VALUE);
        assert_eq!(check(&keys, "orders", VALUE, &header), Ok(()));
        let mut tampered = VALUE.to_vec();
        tampered[8] ^= 1;
        assert_eq!(
            check(&keys, "orders", &tampered, &header),
            Err(SignatureError::Mismatch("orders".into()))
        );
        let mut flipped = header.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(
            check(
                &keys,
                "orders",
                VALUE,
                std::str::from_utf8(&flipped).unwrap()
            )
            .is_err()
        );
        assert!(
            check(&keys, "orders", VALUE, header.trim_start_matches("v1=")).is_err(),
            "no scheme"
        );
        assert!(check(&keys, "orders", VALUE, "v1=not hex").is_err());
    }

    /// Signed for one topic, the message is refused in any other: another job's, and the
    /// same job's high-priority topic.
    #[test]
    fn a_signature_holds_for_its_own_topic_only() {
        let keys = keys(OLD);
        let header = keys.sign("orders", VALUE);
        for other in ["payments", "orders-high", "order", ""] {
            assert_eq!(
                check(&keys, other, VALUE, &header),
                Err(SignatureError::Mismatch(other.into())),
                "{other}"
            );
        }
    }

    #[test]
    fn a_message_without_the_header_is_unsigned_and_an_empty_one_is_a_mismatch() {
        let keys = keys(OLD);
        assert_eq!(
            keys.verify("orders", VALUE, std::iter::empty()),
            Err(SignatureError::Unsigned)
        );
        assert_eq!(
            keys.verify("orders", VALUE, [None]),
            Err(SignatureError::Mismatch("orders".into()))
        );
        assert!(
            SignatureError::Unsigned
                .to_string()
                .starts_with("unsigned: "),
            "the reason a dead letter records"
        );
        assert!(
            SignatureError::Mismatch("orders".into())
                .to_string()
                .starts_with("bad signature: ")
        );
    }

    /// While a key is rotated: the dispatchers verify with both, the API signs with
    /// whichever is first in its list.
    #[test]
    fn during_a_rotation_every_key_verifies_and_the_first_signs() {
        let dispatcher = keys(&format!("{OLD}\n{NEW}\n"));
        let old_api = keys(OLD);
        let new_api = keys(&format!("{NEW},{OLD}"));
        for api in [&old_api, &new_api] {
            let header = api.sign("orders", VALUE);
            assert_eq!(check(&dispatcher, "orders", VALUE, &header), Ok(()));
        }
        assert_eq!(
            new_api.sign("orders", VALUE),
            keys(NEW).sign("orders", VALUE)
        );
        // Once the old key is removed, what it signed is refused.
        let old_signed = old_api.sign("orders", VALUE);
        assert!(check(&keys(NEW), "orders", VALUE, &old_signed).is_err());
        // A repeated header: one valid value among others is enough.
        assert_eq!(
            keys(NEW).verify(
                "orders",
                VALUE,
                [
                    Some(&b"v1=00"[..]),
                    Some(new_api.sign("orders", VALUE).as_bytes())
                ]
            ),
            Ok(())
        );
    }

    #[test]
    fn an_empty_or_short_key_is_refused() {
        assert_eq!(MessageKeys::parse(""), Err(KeyError::Empty));
        assert_eq!(MessageKeys::parse(" \n,\n"), Err(KeyError::Empty));
        assert_eq!(
            MessageKeys::parse(&format!("{OLD}\nshort\n")),
            Err(KeyError::TooShort {
                position: 2,
                len: 5
            })
        );
        assert_eq!(
            MessageKeys::parse(&"k".repeat(MIN_KEY_BYTES - 1)),
            Err(KeyError::TooShort {
                position: 1,
                len: MIN_KEY_BYTES - 1
            })
        );
        // A file's final newline and surrounding blanks are no part of the key.
        assert_eq!(keys(&format!("  {OLD}\r\n")), keys(OLD));
        assert!(
            !format!("{:?}", keys(OLD)).contains(OLD),
            "Debug shows no key"
        );
    }
}
