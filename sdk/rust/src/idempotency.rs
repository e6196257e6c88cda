//! Idempotency keys derived from payload fields, the same in every asyncd SDK.
//!
//! The key is the hex SHA-256 of the canonical JSON of `[task_type, selection]`, where
//! selection is `{field: value, …}` for the named top-level fields (the whole payload
//! when no field is named). Canonical JSON: objects with keys sorted by code point, no
//! whitespace, integral numbers as plain integers (`42.0` is `42`, `1e300` its exact
//! digits), other numbers as the shortest round-trip float64 in exponent form with a
//! signed two-digit exponent (`1.5e-07`, `-2.5e+00`), strings escaped only where JSON
//! requires it (`\" \\ \b \f \n \r \t`, other controls as `\u00xx`). The Go SDK's
//! `IdempotencyKeyFrom` and the Python SDK's `idempotency_key_from` compute the same keys.
//!
//! The canonical form is computed from the JSON text `serde_json` writes for the
//! payload, read with a parser that keeps number literals as written, so integers of
//! any size keep their digits.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Derives an idempotency key from the task type and the named top-level `fields` of
/// `payload` (the whole payload when `fields` is empty), so that resubmitting the same
/// logical task — after a timeout, a crash, a redelivered message — yields the same
/// key and asyncd keeps only the first task.
///
/// ```
/// let key = asyncd_client::idempotency_key_from(
///     "cancel_expired_order",
///     &serde_json::json!({"order_id": 42, "at": "now"}),
///     &["order_id"],
/// )
/// .unwrap();
/// assert_eq!(key, "4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec");
/// ```
pub fn idempotency_key_from<T: Serialize + ?Sized>(
    task_type: &str,
    payload: &T,
    fields: &[&str],
) -> Result<String, Error> {
    if task_type.is_empty() {
        return Err(Error::IdempotencyKey("needs a task type".into()));
    }
    let value = parse_payload(payload)?;
    let selection = if fields.is_empty() {
        value
    } else {
        let Canon::Obj(mut obj) = value else {
            return Err(Error::IdempotencyKey(
                "fields named, but the payload is not a JSON object".into(),
            ));
        };
        let mut selected = BTreeMap::new();
        for field in fields {
            let v = obj.remove(*field).or_else(|| selected.get(*field).cloned());
            let Some(v) = v else {
                return Err(Error::IdempotencyKey(format!(
                    "field {field:?} is not in the payload"
                )));
            };
            selected.insert(field.to_string(), v);
        }
        Canon::Obj(selected)
    };
    let mut text = String::new();
    Canon::Arr(vec![Canon::Str(task_type.to_string()), selection]).write(&mut text);
    Ok(hex::encode(Sha256::digest(text.as_bytes())))
}

/// The canonical JSON text of `value` that [`idempotency_key_from`] hashes.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    let mut text = String::new();
    parse_payload(value)?.write(&mut text);
    Ok(text)
}

fn parse_payload<T: Serialize + ?Sized>(payload: &T) -> Result<Canon, Error> {
    let text = serde_json::to_string(payload).map_err(Error::Payload)?;
    let mut p = Parser {
        s: text.as_bytes(),
        text: &text,
        i: 0,
    };
    let v = p.value().map_err(Error::IdempotencyKey)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(Error::IdempotencyKey(
            "trailing data after JSON value".into(),
        ));
    }
    Ok(v)
}

#[derive(Debug, Clone)]
enum Canon {
    Null,
    Bool(bool),
    /// Already in canonical form.
    Num(String),
    Str(String),
    Arr(Vec<Canon>),
    /// BTreeMap orders by bytes, which for UTF-8 is code point order; a repeated key
    /// keeps its last value, as Go's and Python's decoders do.
    Obj(BTreeMap<String, Canon>),
}

impl Canon {
    fn write(&self, out: &mut String) {
        match self {
            Canon::Null => out.push_str("null"),
            Canon::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Canon::Num(n) => out.push_str(n),
            Canon::Str(s) => write_string(out, s),
            Canon::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Canon::Obj(map) => {
                out.push('{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, k);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The canonical text of a JSON number literal.
fn canonical_number(lit: &str) -> Result<String, String> {
    if !lit.contains(['.', 'e', 'E']) {
        // An integer of any size: keep its digits, without sign for zero.
        let (neg, digits) = match lit.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, lit),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad number {lit:?}"));
        }
        let digits = digits.trim_start_matches('0');
        return Ok(match (neg, digits.is_empty()) {
            (_, true) => "0".to_string(),
            (true, false) => format!("-{digits}"),
            (false, false) => digits.to_string(),
        });
    }
    let f: f64 = lit.parse().map_err(|e| format!("number {lit:?}: {e}"))?;
    if !f.is_finite() {
        return Err(format!("number {lit:?} out of range"));
    }
    if f == f.trunc() {
        // `{:.0}` prints the exact decimal value of the float.
        let s = format!("{f:.0}");
        return Ok(if s == "-0" { "0".to_string() } else { s });
    }
    // Shortest round-trip digits, exponent with sign and at least two digits (Go's 'e').
    let s = format!("{f:e}");
    let (mantissa, exp) = s.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    Ok(format!(
        "{mantissa}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.unsigned_abs()
    ))
}

/// A JSON reader that keeps number literals as written.
struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err(&self, what: &str) -> String {
        format!("invalid JSON at byte {}: {what}", self.i)
    }

    fn literal(&mut self, word: &str, v: Canon) -> Result<Canon, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("unexpected token"))
        }
    }

    fn value(&mut self) -> Result<Canon, String> {
        self.ws();
        match self.s.get(self.i) {
            None => Err(self.err("unexpected end")),
            Some(b'n') => self.literal("null", Canon::Null),
            Some(b't') => self.literal("true", Canon::Bool(true)),
            Some(b'f') => self.literal("false", Canon::Bool(false)),
            Some(b'"') => self.string().map(Canon::Str),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Canon::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Canon::Arr(items));
                        }
                        _ => return Err(self.err("expected , or ]")),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut map = BTreeMap::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Canon::Obj(map));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return Err(self.err("expected a key"));
                    }
                    let k = self.string()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return Err(self.err("expected :"));
                    }
                    self.i += 1;
                    let v = self.value()?;
                    map.insert(k, v);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Canon::Obj(map));
                        }
                        _ => return Err(self.err("expected , or }")),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                canonical_number(&self.text[start..self.i]).map(Canon::Num)
            }
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .text
            .get(self.i..self.i + 4)
            .ok_or_else(|| self.err("short \\u escape"))?;
        let n = u32::from_str_radix(digits, 16).map_err(|_| self.err("bad \\u escape"))?;
        self.i += 4;
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\') {
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match self.s.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(_) => {
                    self.i += 1;
                    let esc = *self.s.get(self.i).ok_or_else(|| self.err("bad escape"))?;
                    self.i += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.i..].starts_with(b"\\u")
                            {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    self.i = save;
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            // A lone surrogate decodes as U+FFFD, as in Go.
                            out.push(c.unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(self.err("bad escape")),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::value::RawValue;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    // The same vectors are in sdk/go/idempotency_test.go and
    // sdk/python/tests/test_idempotency.py: every SDK must derive the same key.
    #[test]
    fn canonical_json_vectors_shared_with_go_and_python() {
        let big = "1000000000000000052504760255204420248704468581108159154915854115511802457988908195786371375080447864043704443832883878176942523235360430575644792184786706982848387200926575803737830233794788090059368953234970799945081119038967640880074652742780142494579258788820056842838115669472196386865459400540160";
        let cases = [
            (
                r#"{"b":1,"a":[true,false,null],"c":"x"}"#.to_string(),
                r#"{"a":[true,false,null],"b":1,"c":"x"}"#.to_string(),
            ),
            (
                "[42.0, -0, 1e3, 1.5e-7, 0.1, 123456789.5, 1e300, 12345678901234567890]".into(),
                format!("[42,0,1000,1.5e-07,1e-01,1.234567895e+08,{big},12345678901234567890]"),
            ),
            (
                r#""a\"b\\c\n\t\u0001\u001f/<>&é😀\u2028""#.into(),
                "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f/<>&é😀\u{2028}\"".into(),
            ),
            (
                r#"{"é":1,"z":2,"A":3,"😀":4,"ｚ":5}"#.into(),
                r#"{"A":3,"z":2,"é":1,"ｚ":5,"😀":4}"#.into(),
            ),
            ("{ }".into(), "{}".into()),
            (
                "[-2.5, 1e-5, 5e-324, 1e22, 0.30000000000000004]".into(),
                "[-2.5e+00,1e-05,5e-324,10000000000000000000000,3.0000000000000004e-01]".into(),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(canonical_json(&raw(&input)).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn canonical_json_of_rust_values() {
        // serde_json writes 42.0_f64 as "42.0": still the integer 42.
        assert_eq!(
            canonical_json(&json!({"n": 42.0, "f": 0.5, "big": u64::MAX, "neg": i64::MIN}))
                .unwrap(),
            r#"{"big":18446744073709551615,"f":5e-01,"n":42,"neg":-9223372036854775808}"#
        );
        assert_eq!(canonical_json(&[-0.0_f64, 100.0]).unwrap(), "[0,100]");
        assert_eq!(canonical_json("\u{7f}\u{0}").unwrap(), "\"\u{7f}\\u0000\"");
        assert_eq!(
            canonical_json(&raw(
                r#"["\ud83d\ude00", "\ud800x", "\u00e9", {"a":1,"a":2}]"#
            ))
            .unwrap(),
            "[\"😀\",\"\u{fffd}x\",\"é\",{\"a\":2}]"
        );
    }

    #[test]
    fn key_vectors_shared_with_go_and_python() {
        let vectors: [(&str, &str, &[&str], &str); 3] = [
            (
                "cancel_expired_order",
                r#"{"order_id":42,"customer":"ann"}"#,
                &["order_id"],
                "4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec",
            ),
            (
                "send_email",
                r#"{"to":"a@b.c","subject":"Grüße","n":1.5}"#,
                &[],
                "57331f991c0efb748bd8e40a152f18cf790e31d13a90019a89571a5bb93315f6",
            ),
            (
                "send_email",
                r#"{"to":"a@b.c","subject":"Grüße","n":1.5}"#,
                &["to", "n"],
                "506c0222380f9cad6b1ca8b019bc6ebadbb04ede3cc7caf3da21b21135d17b52",
            ),
        ];
        for (task_type, payload, fields, want) in vectors {
            assert_eq!(
                idempotency_key_from(task_type, &raw(payload), fields).unwrap(),
                want,
                "{task_type} {payload} {fields:?}"
            );
            // The same payload as a serde_json::Value gives the same key.
            let value: serde_json::Value = serde_json::from_str(payload).unwrap();
            assert_eq!(
                idempotency_key_from(task_type, &value, fields).unwrap(),
                want
            );
        }
    }

    #[derive(Serialize)]
    struct Order {
        order_id: u64,
        customer: &'static str,
        amount: f64,
    }

    #[test]
    fn key_depends_on_named_fields_and_type_only() {
        let order = Order {
            order_id: 42,
            customer: "ann",
            amount: 9.5,
        };
        let a = key("cancel_expired_order", &order, &["order_id"]);
        assert_eq!(a.len(), 64);
        assert_eq!(
            a,
            "4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec"
        );
        let other = json!({"order_id": 42.0, "customer": "bob"});
        assert_eq!(key("cancel_expired_order", &other, &["order_id"]), a);
        let o43 = Order {
            order_id: 43,
            ..order
        };
        assert_ne!(key("cancel_expired_order", &o43, &["order_id"]), a);
        let order = Order {
            order_id: 42,
            ..o43
        };
        assert_ne!(key("refund_order", &order, &["order_id"]), a);
        assert_eq!(
            key("t", &order, &["customer", "order_id"]),
            key("t", &order, &["order_id", "customer"])
        );
        assert_eq!(
            key("t", &order, &["order_id", "order_id"]),
            key("t", &order, &["order_id"])
        );
    }

    fn key<T: Serialize>(task_type: &str, payload: &T, fields: &[&str]) -> String {
        idempotency_key_from(task_type, payload, fields).unwrap()
    }

    #[test]
    fn key_errors() {
        let err = idempotency_key_from("t", &json!({"a": 1}), &["missing"]).unwrap_err();
        assert!(err.to_string().contains("not in the payload"), "{err}");
        let err = idempotency_key_from("t", &json!([1]), &["a"]).unwrap_err();
        assert!(err.to_string().contains("not a JSON object"), "{err}");
        assert!(matches!(
            idempotency_key_from("", &1, &[]),
            Err(Error::IdempotencyKey(_))
        ));
        // A map with non-string keys does not serialize to JSON.
        let bad: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(matches!(
            idempotency_key_from("t", &bad, &[]),
            Err(Error::Payload(_))
        ));
    }

    #[test]
    fn number_edge_cases() {
        for (lit, want) in [
            ("-0", "0"),
            ("-0.0", "0"),
            ("0", "0"),
            ("1E2", "100"),
            ("1e+2", "100"),
            ("-1.25e-3", "-1.25e-03"),
            (
                "123456789012345678901234567890",
                "123456789012345678901234567890",
            ),
            ("1.7976931348623157e308", &format!("{:.0}", f64::MAX)),
            ("1.0e-300", "1e-300"),
        ] {
            assert_eq!(canonical_number(lit).unwrap(), want, "{lit}");
        }
        assert!(canonical_number("1e400").is_err());
    }
}
