//! Prints the operator's CRDs as YAML, one document each (AsyncJobConfig, then
//! AsyncLimiter): `cargo run -p asyncd-operator --bin crdgen > crds/asyncjobconfigs.yaml`.
//! A test fails when the committed file (or the Helm chart's copy) differs.

fn main() {
    print!("{}", asyncd_operator::crd::yaml());
}
