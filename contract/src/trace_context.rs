//! The W3C Trace Context (`traceparent` and `tracestate`) a task carries from its submit
//! to every executor call: read from the submit's headers, kept with the task, sent on
//! under each attempt's span. Only the value type: the spans asyncd records and exports
//! are the server's (`dispatcher/src/trace.rs`).

/// The longest `tracestate` kept: the W3C limit of 32 members of at most 256 bytes is
/// far above what anyone sends, and the store keeps it with every task; the spec lets a
/// vendor drop a `tracestate` it will not carry.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A valid W3C trace context: what the store keeps and executors receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The span the next hop is a child of.
    pub parent_id: [u8; 8],
    pub flags: u8,
    /// Passed on as given (when within [`MAX_TRACESTATE_BYTES`] and printable).
    pub state: Option<String>,
}

impl TraceContext {
    /// Reads a `traceparent` (and its `tracestate`) as the W3C Trace Context spec says a
    /// receiver must: `None` for anything malformed, which the caller then ignores.
    /// Versions above 00 are read by their 00 prefix, as the spec asks.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let value = traceparent.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = hex_bytes::<1>(&value[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if version > 0 && bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&value[3..35])?;
        let parent_id = hex_bytes::<8>(&value[36..52])?;
        let flags = hex_bytes::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        let state = tracestate
            .map(|s| s.trim_matches([' ', '\t']))
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_TRACESTATE_BYTES
                    && s.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_string);
        Some(Self {
            trace_id,
            parent_id,
            flags,
            state,
        })
    }

    /// The `traceparent` header, version 00.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.parent_id),
            self.flags
        )
    }

    /// Whether the caller sampled this trace: asyncd records spans only for those.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The same trace, continued under span `parent_id`.
    pub fn child(&self, parent_id: [u8; 8]) -> Self {
        Self {
            parent_id,
            ..self.clone()
        }
    }
}

/// Only lowercase hex, as the spec allows.
fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.as_bytes();
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let ctx = TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(ctx.traceparent(), VALID);
        assert!(ctx.sampled());
        assert_eq!(ctx.state.as_deref(), Some("rojo=00f067aa0ba902b7"));
        let child = ctx.child([1; 8]);
        assert_eq!(
            child.traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0101010101010101-01"
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
        // A later version is read by its version-00 prefix.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future";
        assert_eq!(
            TraceContext::parse(future, None).unwrap().traceparent(),
            VALID
        );
    }

    #[test]
    fn a_tracestate_no_store_should_keep_is_dropped() {
        let long = "a=".to_string() + &"b".repeat(MAX_TRACESTATE_BYTES);
        for bad in [long.as_str(), "k=v\u{0}", "k=é", "  "] {
            assert_eq!(
                TraceContext::parse(VALID, Some(bad)).unwrap().state,
                None,
                "{bad:?}"
            );
        }
    }
}
