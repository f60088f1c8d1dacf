//! Criterion benches; placeholder until the matcher and memory-backend benches land.

fn main() {}
