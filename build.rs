//! Build script. Empty for now: proto compilation and the git revision stamp come later.

fn main() {}
