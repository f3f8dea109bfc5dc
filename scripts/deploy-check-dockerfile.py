#!/usr/bin/env python3
"""Runs a Dockerfile's build stages outside Docker, to show that `docker build` would get through
them (no Docker engine runs in metronome's CI).

    scripts/deploy-check-dockerfile.py [--dockerfile FILE] [--target-dir DIR] [--build-arg K=V]

What it does, in the order Docker would:
  1. the build context: the repository root filtered by FILE.dockerignore (Docker's per-Dockerfile
     ignore file), copied with the files' times kept, as BuildKit's COPY keeps them;
  2. every stage but the last, instruction by instruction: WORKDIR, COPY (from the context or an
     earlier stage), ARG, ENV and RUN (`sh -c`, in the stage's working directory, with the ARG and
     ENV values in its environment). Any other instruction in a build stage is an error, so a new
     one cannot be skipped silently;
  3. the last stage: every COPY source must exist (in the context, or in the stage it names).
Then it runs the final stage's binary with --version.

Each stage's root is a directory of its own, so `/src` is STAGE/src. With --target-dir, cargo in
RUN uses that target directory (CARGO_TARGET_DIR, and `target` in the working directory points
there), and cargo is offline (everything a built tree needs is already fetched). CI points it at
its own target/, already built in release: cargo finds the crate fresh (the copies keep their
times, and cargo keys a path crate by its path under the workspace root), so the build stage
takes seconds. It fails exactly where Docker would: a target the manifest declares that is not in
the stage, a file the code includes that was not copied, a path the last stage copies that the
build did not make.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time


def instructions(text):
    """(keyword, argument, line) for each instruction, continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        keyword, _, argument = buf.partition(" ")
        out.append((keyword.upper(), argument.strip(), start))
        buf = ""
    return out


def stages(text):
    """[(name, [(keyword, argument, line)])] in order; a stage without AS is named by its index."""
    result = []
    for keyword, argument, line in instructions(text):
        if keyword == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", argument, re.I)
            result.append((m.group(2) or str(len(result)), [(keyword, argument, line)]))
        elif result:
            result[-1][1].append((keyword, argument, line))
    return result


class Ignore:
    """Docker's .dockerignore: the last pattern matching a path or one of its parents decides."""

    def __init__(self, path):
        self.rules = []
        if os.path.exists(path):
            for line in open(path):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                negated = line.startswith("!")
                pattern = line[1:] if negated else line
                pattern = os.path.normpath(pattern.strip("/"))
                self.rules.append((negated, pattern, re.compile(self.regex(pattern))))

    @staticmethod
    def regex(pattern):
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                out += ".*"
                i += 2
            elif pattern[i] == "*":
                out += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                out += "[^/]"
                i += 1
            else:
                out += re.escape(pattern[i])
                i += 1
        return out + "$"

    def excluded(self, rel):
        parts = rel.split("/")
        prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
        verdict = False
        for negated, _pattern, rx in self.rules:
            if any(rx.match(p) for p in prefixes):
                verdict = not negated
        return verdict

    def may_hold_included(self, rel):
        """Whether a directory excluded as a whole could still hold a path a `!` rule keeps."""
        return any(negated and (p == rel or p.startswith(rel + "/") or "*" in p) for negated, p, _ in self.rules)


def build_context(root, ignore, dest):
    """Copies the files of the context, times kept; returns how many."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in dirnames:
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if d == ".git" or (ignore.excluded(rel) and not ignore.may_hold_included(rel)):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if ignore.excluded(rel):
                continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(dirpath, f), target, follow_symlinks=False)
            count += 1
    return count


def copy_into(src, dst_arg, workdir, stage_root, many):
    """COPY's rules: a directory's contents go into the destination; files go into a directory
    destination (one ending in / or, with several sources, always)."""
    dst = dst_arg if dst_arg.startswith("/") else os.path.join(workdir, dst_arg)
    dst = os.path.join(stage_root, dst.lstrip("/"))
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
    else:
        if dst_arg.endswith("/") or many:
            os.makedirs(dst, exist_ok=True)
            dst = os.path.join(dst, os.path.basename(src))
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


class Failure(Exception):
    pass


def run_stage(name, body, roots, context, args, target_dir):
    root = roots[name]
    workdir = "/"
    env = dict(os.environ)
    env.pop("CARGO_TARGET_DIR", None)
    declared = {}
    for keyword, argument, line in body[1:]:
        where = f"stage {name}, line {line}: {keyword} {argument[:100]}"
        print(f"  {where}", flush=True)
        if keyword == "WORKDIR":
            workdir = argument if argument.startswith("/") else os.path.join(workdir, argument)
            os.makedirs(os.path.join(root, workdir.lstrip("/")), exist_ok=True)
            if target_dir:
                link = os.path.join(root, workdir.lstrip("/"), "target")
                if not os.path.lexists(link):
                    os.symlink(target_dir, link)
        elif keyword == "COPY":
            copy(name, argument, where, workdir, root, roots, context)
        elif keyword == "ARG":
            key, eq, default = argument.partition("=")
            value = args.get(key, default if eq else None)
            declared[key] = value
            if value is not None:
                env[key] = value
            else:
                env.pop(key, None)
        elif keyword == "ENV":
            for key, value in env_pairs(argument):
                env[key] = expand(value, env)
        elif keyword == "RUN":
            if argument.startswith("--"):
                raise Failure(f"{where}: RUN flags are not emulated")
            if target_dir:
                env["CARGO_TARGET_DIR"] = target_dir
                env["CARGO_NET_OFFLINE"] = "true"
            started = time.monotonic()
            cwd = os.path.join(root, workdir.lstrip("/"))
            result = subprocess.run(["sh", "-c", argument], cwd=cwd, env=env)
            print(f"    exit {result.returncode} after {time.monotonic() - started:.1f}s", flush=True)
            if result.returncode != 0:
                raise Failure(f"{where}: exit {result.returncode}")
        elif keyword in ("LABEL",):
            pass
        else:
            raise Failure(f"{where}: {keyword} in a build stage is not emulated")
    return workdir


def copy(stage, argument, where, workdir, root, roots, context):
    words = shlex.split(argument)
    source_root = context
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            other = flag.split("=", 1)[1]
            if other not in roots:
                raise Failure(f"{where}: no earlier stage {other}")
            source_root = roots[other]
        elif not flag.startswith(("--chown=", "--chmod=", "--link")):
            raise Failure(f"{where}: COPY flag {flag} is not emulated")
    *sources, dst = words
    for s in sources:
        path = os.path.join(source_root, s.lstrip("/"))
        if not os.path.lexists(path):
            what = "the build context (missing, or left out by the .dockerignore)" if source_root == context \
                else f"stage {os.path.basename(source_root)}"
            raise Failure(f"{where}: COPY source {s} is not in {what}")
        if root is not None:
            copy_into(path, dst, workdir, root, len(sources) > 1)


def env_pairs(argument):
    words = shlex.split(argument)
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [tuple(w.split("=", 1)) for w in words]


def expand(value, env):
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", default="deploy/docker/Dockerfile")
    parser.add_argument("--context", default=".")
    parser.add_argument("--target-dir", help="cargo's target directory for RUN (CARGO_TARGET_DIR)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    opts = parser.parse_args()
    context_root = os.path.abspath(opts.context)
    target_dir = os.path.abspath(opts.target_dir) if opts.target_dir else None
    build_args = dict(a.split("=", 1) for a in opts.build_arg)
    text = open(opts.dockerfile).read()
    parsed = stages(text)
    if len(parsed) < 2:
        print("not a multi-stage Dockerfile")
        return 1
    with tempfile.TemporaryDirectory(prefix="dockerfile-") as tmp:
        context = os.path.join(tmp, "context")
        os.makedirs(context)
        n = build_context(context_root, Ignore(opts.dockerfile + ".dockerignore"), context)
        print(f"build context: {n} files (after {os.path.basename(opts.dockerfile)}.dockerignore)")
        roots = {}
        try:
            for name, body in parsed[:-1]:
                roots[name] = os.path.join(tmp, "stage-" + name)
                os.makedirs(roots[name])
                print(f"stage {name} ({body[0][1]})")
                run_stage(name, body, roots, context, build_args, target_dir)
            final_name, final = parsed[-1]
            print(f"final stage {final_name} ({final[0][1]}): COPY sources only, its RUN is not run")
            binary = None
            for keyword, argument, line in final[1:]:
                if keyword == "COPY":
                    where = f"final stage, line {line}: COPY {argument}"
                    copy(final_name, argument, where, "/", None, roots, context)
                    m = re.match(r"--from=(\S+)\s+(\S+)\s+/usr/local/bin/metronome$", argument)
                    if m:
                        binary = os.path.join(roots[m.group(1)], m.group(2).lstrip("/"))
        except Failure as e:
            print(f"FAILED: {e}")
            return 1
        if not binary:
            print("FAILED: the final stage copies no binary to /usr/local/bin/metronome")
            return 1
        version = subprocess.run([binary, "--version"], capture_output=True, text=True)
        print(f"the image's binary: {version.stdout.strip()} ({os.path.getsize(binary) / 1e6:.1f} MB)")
        if version.returncode != 0:
            return version.returncode
        # `docker build --build-arg METRONOME_COMMIT=…` must reach the binary's --version.
        commit = build_args.get("METRONOME_COMMIT", "")[:12]
        if commit and f"(commit {commit})" not in version.stdout:
            print(f"FAILED: --version does not name the commit given as METRONOME_COMMIT ({commit})")
            return 1
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
