//! The lease token an executor receives, and its check on a callback.
//!
//! The store keeps two things per task: `lease_token`, a counter that every claim and
//! every attempt bumps — the fencing token the store's transitions compare — and
//! `lease_secret`, 32 random bytes drawn once at insert. What an executor receives in
//! `Asyncd-Lease-Token` is `hex(HMAC-SHA256(lease_secret, "<id>\n<lease_token>"))`: 256
//! bits nobody can guess, different for every attempt (an earlier attempt's token, or
//! another task's, matches nothing), and derived rather than stored, so beginning an
//! attempt writes nothing more than it did. A callback's token is compared in constant
//! time with the one derived from the row, and the row's counter is then the fencing
//! token its transition names, so a newer attempt that began meanwhile still wins.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// A new task's `lease_secret`: 32 bytes from the operating system's CSPRNG (through
/// `rand`'s `ThreadRng`, a ChaCha CSPRNG seeded and reseeded from it), in hex.
pub fn new_secret() -> String {
    hex_of(rand::random())
}

/// `bytes` in lowercase hex, through a buffer of the right size: `hex::encode` collects
/// its output a `char` at a time, which with the id's draw was a tenth of the API's CPU
/// per task of a batch submit.
fn hex_of(bytes: [u8; 32]) -> String {
    let mut text = [0u8; 64];
    hex::encode_to_slice(bytes, &mut text).expect("64 digits for 32 bytes");
    String::from_utf8(text.to_vec()).expect("hex digits are ASCII")
}

fn mac(secret: &str, id: &str, counter: i64) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any size");
    mac.update(id.as_bytes());
    mac.update(b"\n");
    mac.update(counter.to_string().as_bytes());
    mac
}

/// The token of attempt `counter` of task `id`.
pub fn token(secret: &str, id: &str, counter: i64) -> String {
    hex_of(mac(secret, id, counter).finalize().into_bytes().into())
}

/// Whether `presented` is the token of attempt `counter` of task `id`, compared in
/// constant time. A row without a secret (written by hand, never by asyncd) matches
/// nothing: its token would be computable by anyone.
pub fn matches(secret: &str, id: &str, counter: i64, presented: &str) -> bool {
    if secret.is_empty() {
        return false;
    }
    let expected = token(secret, id, counter);
    expected.as_bytes().ct_eq(presented.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_and_task_has_its_own_token() {
        let secret = new_secret();
        assert_eq!(secret.len(), 64);
        assert!(
            secret
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{secret}: lowercase hex"
        );
        assert_ne!(secret, new_secret(), "secrets are random");
        let first = token(&secret, "t1", 2);
        assert_eq!(first.len(), 64);
        assert!(matches(&secret, "t1", 2, &first));
        assert!(!matches(&secret, "t1", 4, &first), "a later attempt");
        assert!(!matches(&secret, "t2", 2, &first), "another task");
        assert!(!matches(&new_secret(), "t1", 2, &first), "another secret");
        assert!(!matches(&secret, "t1", 2, "2"), "the bare counter");
        assert!(!matches(&secret, "t1", 2, ""), "nothing");
        assert!(!matches("", "t1", 2, &token("", "t1", 2)), "no secret");
    }
}
