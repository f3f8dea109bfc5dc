//! Names the commit a binary was built from, for `metronome --version`.
//!
//! Sets `METRONOME_BUILD_COMMIT` for the crate, from the first of:
//! 1. the `METRONOME_COMMIT` environment variable (a build without the repository, such as the
//!    image: `docker build --build-arg METRONOME_COMMIT=$(git rev-parse --short=12 HEAD)`);
//! 2. `.cargo_vcs_info.json`, which `cargo package` writes into a crate built from a registry;
//! 3. `git rev-parse HEAD` in a clone whose top level is this crate (release builds only: a debug
//!    build would otherwise recompile the whole crate after every commit);
//! 4. otherwise `unknown`.
//!
//! Every path it watches exists, so cargo never reruns it for a missing file, and the absolute
//! paths of the repository's `HEAD` and reflog still hold when the tree is copied elsewhere and
//! built into the same target directory (scripts/deploy-check-dockerfile.py does that).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=METRONOME_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = from_env()
        .or_else(|| from_vcs_info(&manifest_dir))
        .or_else(|| from_git(&manifest_dir))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo::rustc-env=METRONOME_BUILD_COMMIT={commit}");
}

/// An explicit commit, when a builder without the repository passes one.
fn from_env() -> Option<String> {
    let value = std::env::var("METRONOME_COMMIT").ok()?;
    short(value.trim())
}

/// The commit `cargo package` recorded: `{"git": {"sha1": "…"}, "path_in_vcs": ""}`.
fn from_vcs_info(manifest_dir: &Path) -> Option<String> {
    let path = manifest_dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo::rerun-if-changed={}", path.display());
    let after = text.split("\"sha1\"").nth(1)?;
    let sha = after.split('"').nth(1)?;
    short(sha)
}

/// `git rev-parse HEAD`, when this crate is the top of a clone and the build is not a debug one.
fn from_git(manifest_dir: &Path) -> Option<String> {
    if std::env::var("PROFILE").ok()? != "release" {
        return None;
    }
    // Watched before git is asked anything: a git that failed once (a lock, a transient error)
    // must not leave `unknown` cached until build.rs itself changes.
    for name in ["HEAD", "logs/HEAD"] {
        let path = manifest_dir.join(".git").join(name);
        if path.is_file() {
            println!("cargo::rerun-if-changed={}", path.display());
        }
    }
    let top = git(manifest_dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    // A crate unpacked inside someone else's repository must not take that repository's commit.
    if !same(Path::new(&top), manifest_dir) {
        return None;
    }
    // HEAD changes on a checkout, the reflog on every commit (worktrees have their own of both).
    for name in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(
            manifest_dir,
            &["rev-parse", "--path-format=absolute", "--git-path", name],
        ) {
            if Path::new(&path).exists() {
                println!("cargo::rerun-if-changed={path}");
            }
        }
    }
    short(&git(manifest_dir, &["rev-parse", "HEAD"])?)
}

/// One line of git's output, or nothing when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// The first 12 hex digits of a commit, or nothing when it is not one.
fn short(sha: &str) -> Option<String> {
    let ok = sha.len() >= 7 && sha.chars().all(|c| c.is_ascii_hexdigit());
    ok.then(|| sha.chars().take(12).collect())
}
