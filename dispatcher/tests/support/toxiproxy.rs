//! The tests' Toxiproxy proxies (`asyncd-toxiproxy`): one per test, in front of a
//! database server, on the server `ASYNCD_TEST_TOXIPROXY_URL` names.

pub use asyncd_toxiproxy::{Fault, Proxy};

use super::Service;

/// A proxy to the server of `database_url`, or `None` when no Toxiproxy server is named:
/// the test skips ([`Service::address`]; with `ASYNCD_TEST_REQUIRE_BACKENDS=1` that panics
/// instead).
pub async fn proxy_to(database_url: &str) -> Option<Proxy> {
    let api = Service::Toxiproxy.address()?;
    let name = format!("asyncd-{}", uuid::Uuid::now_v7().simple());
    Some(
        Proxy::create(&api, &name, database_url)
            .await
            .unwrap_or_else(|err| panic!("{err}")),
    )
}
