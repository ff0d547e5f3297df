#!/usr/bin/env python3
"""Writes docs/adr/README.md, the index of the architecture decisions: each ADR's number, title
and status (with what superseded or amended it, as its own Status line says). With --check,
fails instead when the index in the repository is not what this would write (CI runs that), so
that a new ADR, or a changed status, cannot be left out of the index."""
import pathlib
import re
import sys

ADR = pathlib.Path(__file__).resolve().parent.parent / "docs" / "adr"


def status_of(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lower().startswith("status:"):
            out = [line.split(":", 1)[1].strip()]
            for more in lines[i + 1:]:
                if not more.strip() or more.startswith("#"):
                    break
                out.append(more.strip())
            return " ".join(out)
    return "(no status line)"


def render() -> str:
    rows = []
    for path in sorted(ADR.glob("[0-9][0-9][0-9][0-9]-*.md")):
        text = path.read_text(encoding="utf-8")
        title = re.sub(r"^#\s*\d+\.\s*", "", text.splitlines()[0]).strip()
        status = status_of(text).replace("|", "\\|")
        rows.append(f"| [{path.name[:4]}]({path.name}) | {title} | {status} |")
    return (
        "# Architecture decisions\n\n"
        "One short record per decision: its context, the decision, its consequences. A later\n"
        "decision that changes an earlier one says so in both (\"amended by\", \"superseded by\").\n"
        "This index is written by `scripts/adr-index.py` (CI checks that it is current).\n\n"
        "| ADR | decision | status |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main() -> int:
    target = ADR / "README.md"
    want = render()
    if "--check" in sys.argv[1:]:
        have = target.read_text(encoding="utf-8") if target.exists() else ""
        if have != want:
            print("docs/adr/README.md is not current: run python3 scripts/adr-index.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(want, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
