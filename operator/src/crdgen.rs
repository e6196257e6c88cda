//! Prints the AsyncJobConfig CRD as YAML: `cargo run -p asyncd-operator --bin crdgen >
//! crds/asyncjobconfigs.yaml`. A test fails when the committed file differs.

fn main() {
    print!("{}", asyncd_operator::crd::yaml());
}
