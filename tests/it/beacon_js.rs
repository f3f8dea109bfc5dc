//! The browser beacon module (assets/metronome-beacon.js) under Node's test runner: its SSE and
//! NDJSON parsing, token-event rules, gap and size caps, and `metronomeFetch` against a streaming
//! server on 127.0.0.1 (tests/js/beacon.test.mjs). Node ships with this project's machines
//! (Debian package `nodejs`); the real-browser check is scripts/e2e-edge.sh with Chromium.

use std::process::Command;

#[test]
fn the_beacon_module_passes_its_node_tests() {
    let output = match Command::new("node")
        .args(["--test", "tests/js/"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!("cannot run node ({e}): install it with `apt-get install nodejs`"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "node --test tests/js/ failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("# fail 0"), "{stdout}");
    assert!(!stdout.contains("# pass 0"), "no test ran:\n{stdout}");
}
