//! Which addresses an executor may be at. Whoever may write a job config chooses its
//! executor URL; without a policy a dispatcher would call a cloud's metadata service, the
//! Kubernetes API server or its own loopback on their behalf, and report what answered.
//!
//! The policy is checked on the address actually connected to: [`PolicyResolver`] drops
//! refused addresses from every DNS answer (so a name that resolves to a metadata address
//! gets nowhere), and an IP-literal URL, which no resolver sees, is checked per call
//! against the address the job's validation parsed out of it (`Job::executor_ip`). The
//! resolver runs only when a connection is opened; the per-call check compares one
//! address with a few ranges, without allocating or locking.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Ranges no executor may be at anywhere: link-local, where cloud metadata services
/// answer (169.254.169.254), and EC2's IPv6 metadata address.
const LINK_LOCAL: [&str; 3] = ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128"];

/// Ranges refused besides in a cluster: loopback (the dispatcher's own ports and
/// sidecars) and the unspecified addresses, which a connect turns into loopback.
const CLUSTER_LOCAL: [&str; 4] = ["127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"];

/// Denied and allowed address ranges. An address is refused when it is in a denied
/// range and in no allowed one: allowed ranges are exceptions, and denying `0.0.0.0/0`
/// and `::/0` turns the allowed ranges into the only ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPolicy {
    denied: Vec<IpNet>,
    allowed: Vec<IpNet>,
}

/// An executor address the policy refuses: the attempt's `last_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("executor address {0} refused by policy")]
pub struct Refused(pub IpAddr);

impl AddressPolicy {
    /// Outside a cluster (`asyncd dev`, tests): executors on loopback are allowed; only
    /// link-local is refused.
    pub fn local() -> Self {
        Self {
            denied: nets(&LINK_LOCAL),
            allowed: Vec::new(),
        }
    }

    /// In a cluster: link-local, loopback, the unspecified addresses and
    /// `api_server` (the Kubernetes API server's service address) are refused.
    pub fn cluster(api_server: Option<IpAddr>) -> Self {
        let mut denied = nets(&LINK_LOCAL);
        denied.extend(nets(&CLUSTER_LOCAL));
        denied.extend(api_server.map(IpNet::from));
        Self {
            denied,
            allowed: Vec::new(),
        }
    }

    /// `self` with `denied` refused as well and `allowed` excepted.
    pub fn with(mut self, denied: &[IpNet], allowed: &[IpNet]) -> Self {
        self.denied.extend_from_slice(denied);
        self.allowed.extend_from_slice(allowed);
        self
    }

    pub fn check(&self, ip: IpAddr) -> Result<(), Refused> {
        // `::ffff:169.254.169.254` is 169.254.169.254 to the kernel.
        let ip = ip.to_canonical();
        let denied = self.denied.iter().any(|net| net.contains(&ip));
        if denied && !self.allowed.iter().any(|net| net.contains(&ip)) {
            return Err(Refused(ip));
        }
        Ok(())
    }
}

fn nets(ranges: &[&str]) -> Vec<IpNet> {
    ranges
        .iter()
        .map(|range| range.parse().expect("a valid built-in range"))
        .collect()
}

/// The system resolver (`getaddrinfo`, on the blocking pool as reqwest's own), keeping
/// only the addresses the policy allows. A name with none left fails the connection
/// with [`Refused`] naming the first address refused.
pub struct PolicyResolver {
    pub policy: Arc<AddressPolicy>,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = found
                .into_iter()
                .partition(|addr| policy.check(addr.ip()).is_ok());
            match (allowed.is_empty(), refused.first()) {
                (true, Some(first)) => Err(Box::new(Refused(first.ip().to_canonical())) as _),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// The policy's refusal somewhere in `err`'s chain of causes (reqwest wraps a
/// resolver's error in its own and hyper's).
pub fn refusal_in<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refused> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(refused) = err.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn a_cluster_refuses_metadata_loopback_and_the_api_server_and_nothing_else() {
        let policy = AddressPolicy::cluster(Some(ip("10.96.0.1")));
        for refused in [
            "169.254.169.254",
            "fd00:ec2::254",
            "169.254.0.1",
            "fe80::1",
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "0.0.0.0",
            "::",
            "10.96.0.1",
            // The IPv4-mapped forms of the same addresses.
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                policy.check(ip(refused)),
                Err(Refused(ip(refused).to_canonical())),
                "{refused}"
            );
        }
        for allowed in [
            "10.96.0.2",
            "10.244.1.7",
            "192.168.1.1",
            "8.8.8.8",
            "169.255.0.1",
            "fd00::1",
            "2001:db8::1",
        ] {
            assert_eq!(policy.check(ip(allowed)), Ok(()), "{allowed}");
        }
    }

    #[test]
    fn outside_a_cluster_loopback_is_allowed_and_metadata_is_not() {
        let policy = AddressPolicy::local();
        assert_eq!(policy.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(policy.check(ip("::1")), Ok(()));
        assert!(policy.check(ip("169.254.169.254")).is_err());
        assert_eq!(
            Refused(ip("169.254.169.254")).to_string(),
            "executor address 169.254.169.254 refused by policy"
        );
    }

    #[test]
    fn allowed_ranges_are_exceptions_to_the_denied_ones() {
        let policy =
            AddressPolicy::cluster(None).with(&[net("10.0.0.0/8")], &[net("127.0.0.2/32")]);
        assert_eq!(policy.check(ip("127.0.0.2")), Ok(()), "allowed exception");
        assert!(policy.check(ip("127.0.0.1")).is_err());
        assert!(policy.check(ip("10.1.2.3")).is_err(), "denied by flag");
        // Deny everything, allow one range: only that range.
        let only =
            AddressPolicy::local().with(&[net("0.0.0.0/0"), net("::/0")], &[net("10.1.0.0/16")]);
        assert_eq!(only.check(ip("10.1.2.3")), Ok(()));
        assert!(only.check(ip("10.2.0.1")).is_err());
        assert!(only.check(ip("2001:db8::1")).is_err());
    }

    /// A name that resolves only to refused addresses fails with the refusal; reqwest
    /// wraps it, and the refusal is still found in the chain.
    #[tokio::test]
    async fn a_name_resolving_to_a_refused_address_fails_the_call_with_the_refusal() {
        let policy = Arc::new(AddressPolicy::cluster(None));
        let resolver = PolicyResolver {
            policy: policy.clone(),
        };
        let err = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        let refused = refusal_in(err.as_ref()).expect("the refusal");
        assert!(refused.0.is_loopback(), "{refused}");

        let client = reqwest::Client::builder()
            .dns_resolver(PolicyResolver { policy })
            .build()
            .unwrap();
        let err = client.get("http://localhost:1/").send().await.unwrap_err();
        let refused = refusal_in(&err).expect("the refusal in reqwest's error");
        assert!(refused.0.is_loopback(), "{refused}");
    }
}
