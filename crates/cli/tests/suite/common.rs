//! Helpers the CLI's test modules share: the binary run from the repository root.

use std::path::Path;
use std::process::{Command, Output};

/// `grinnder ARGS` from the repository root.
pub fn grinnder(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grinnder"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("the binary runs")
}

/// `grinnder ARGS`, which must succeed: its standard output.
pub fn ok(args: &[&str]) -> String {
    let o = grinnder(args);
    assert!(o.status.success(), "grinnder {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `grinnder ARGS`, which must fail: its standard error.
pub fn fails(args: &[&str]) -> String {
    let o = grinnder(args);
    assert!(!o.status.success(), "grinnder {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}
