#!/usr/bin/env python3
"""Runs the documentation's shell examples, in order, against a real outboxd.

For each page (README.md and the pages of docs/ by default), a fresh `outboxd serve` is started
from `--bin-dir` on a new SQLite file in a temporary directory, with `OUTBOXD_SERVER` pointing at
it and `--bin-dir` first on `PATH`; then every fenced `sh`/`bash` block of the page runs with
`bash -euo pipefail` in that directory, in the order of the page. A block that exits non-zero, or
outlasts `--timeout`, fails the run. A block that cannot run in CI is marked on the line before
its fence with

    <!-- doc-example: skip (the reason) -->

and is listed with its reason instead. Exits 1 when any block failed (or a page has no runnable
block and none marked), 0 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGES = [
    "README.md",
    "docs/concepts.md",
    "docs/guarantees.md",
    "docs/sql-api.md",
    "docs/grpc-api.md",
    "docs/clients/rust.md",
    "docs/operating.md",
    "docs/sinks.md",
    "docs/security.md",
    "docs/deploying.md",
    "docs/configuration.md",
    "docs/benchmarks.md",
    "docs/development.md",
]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*doc-example:\s*skip\s*\((.*)\)\s*-->\s*$")


@dataclass
class Block:
    line: int
    lang: str
    code: str
    skip: str | None


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        skip = SKIP.match(lines[i - 1]) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if lang in ("sh", "bash"):
            blocks.append(Block(i + 1, lang, "\n".join(body) + "\n", skip.group(1) if skip else None))
        i = j + 1
    return blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Outboxd:
    """A fresh outboxd on a SQLite file in `work`."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        self.port = free_port()
        self.log = open(work / "outboxd.log", "wb")
        self.proc = subprocess.Popen(
            [str(bin_dir / "outboxd"), "serve", "--database-url", f"sqlite://{work}/outbox.db",
             "--listen", f"127.0.0.1:{self.port}"],
            cwd=work, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run(
                [str(bin_dir / "outboxd"), "healthcheck", "--addr", f"127.0.0.1:{self.port}", "--timeout", "1s"],
                capture_output=True, text=True,
            )
            if probe.returncode == 0:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"outboxd did not start: see {work / 'outboxd.log'}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_page(path: Path, bin_dir: Path, timeout: float, keep: bool) -> tuple[int, int, list[str]]:
    """(blocks run, blocks skipped, failures) of one page."""
    blocks = blocks_of(path)
    rel = path.relative_to(ROOT)
    runnable = [b for b in blocks if b.skip is None]
    for b in blocks:
        if b.skip is not None:
            print(f"  skip {rel}:{b.line}: {b.skip}")
    if not runnable:
        return 0, len(blocks), []
    work = Path(tempfile.mkdtemp(prefix="outboxd-doc-"))
    failures: list[str] = []
    server = Outboxd(bin_dir, work)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["OUTBOXD_SERVER"] = f"http://127.0.0.1:{server.port}"
    try:
        for b in runnable:
            started = time.monotonic()
            try:
                out = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", b.code], cwd=work, env=env, stdin=subprocess.DEVNULL,
                    capture_output=True, text=True, timeout=timeout,
                )
                rc, output = out.returncode, out.stdout + out.stderr
            except subprocess.TimeoutExpired as e:
                rc = None
                output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            took = time.monotonic() - started
            if rc == 0:
                print(f"  ok   {rel}:{b.line} ({took:.2f} s)")
            else:
                what = f"timed out after {timeout:.0f} s" if rc is None else f"exit {rc}"
                failures.append(f"{rel}:{b.line}: {what}")
                print(f"  FAIL {rel}:{b.line} ({what}, {took:.2f} s)\n" + "".join(f"       {line}\n" for line in b.code.splitlines())
                      + "     output:\n" + "".join(f"       {line}\n" for line in output.splitlines()[-30:]))
    finally:
        server.stop()
        if failures or keep:
            print(f"  (work directory kept: {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return len(runnable), len(blocks) - len(runnable), failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", help="pages to run (default: README.md and docs/)")
    parser.add_argument("--bin-dir", default="target/debug", help="where outboxd and outboxctl are (default: target/debug)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds one block may take (default: 60)")
    parser.add_argument("--keep", action="store_true", help="keep each page's work directory")
    args = parser.parse_args()
    bin_dir = Path(args.bin_dir)
    if not bin_dir.is_absolute():
        bin_dir = (Path.cwd() / bin_dir).resolve()
    for program in ("outboxd", "outboxctl"):
        if not (bin_dir / program).exists():
            print(f"run-doc-examples: {bin_dir / program} does not exist: build it, or pass --bin-dir", file=sys.stderr)
            return 1
    pages = [Path(p).resolve() for p in args.pages] or [ROOT / p for p in DEFAULT_PAGES if (ROOT / p).exists()]
    ran = skipped = 0
    failures: list[str] = []
    for page in pages:
        print(page.relative_to(ROOT))
        r, s, f = run_page(page, bin_dir, args.timeout, args.keep)
        ran, skipped, failures = ran + r, skipped + s, failures + f
    if failures:
        print(f"run-doc-examples: {len(failures)} of {ran} examples failed:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print(f"run-doc-examples: {ran} examples ran, {skipped} skipped (reasons above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
