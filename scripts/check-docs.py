#!/usr/bin/env python3
"""Checks the documentation against the repository and the binaries.

1. Every relative link in README.md, docs/**/*.md, clients/*/README.md and
   examples/**/README.md points at a file that exists, and a `#anchor` names a heading of that
   file (GitHub's slugs) or an explicit `id`/`name` anchor in it.
2. Every `outboxctl …` and `outboxd …` command quoted in those files, in shell code blocks and
   in inline code (also as `cargo run … --bin outboxd -- serve …` and `target/*/outboxd …`),
   names subcommands that exist, and every `--flag` it uses appears in that subcommand's
   `--help` (`outboxctl consumers create --help`, …), run from `--bin-dir` (default
   target/debug).
3. No retired word (docs/glossary.md, the table after `<!-- retired-words`) appears in the code
   (server/src, client/src, tests/src, clients/) or the documentation (docs/, README.md), except
   in the names the glossary keeps (the list after `<!-- kept-names`), in decisions (docs/adr/,
   history) and in the few names of `TEMPORARY` below.

Exits 1 with one line per problem, `file:line: what is wrong`; 0 when all is well.
"""
from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("outboxctl", "outboxd")
SHELL_FENCES = {"", "sh", "bash", "shell", "console", "zsh"}


def doc_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(ROOT.glob("clients/*/README.md"))
    files += sorted((ROOT / "examples").rglob("README.md"))
    return [f for f in files if f.is_file() and "node_modules" not in f.parts]


# ---- markdown structure ------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """The prose lines (number, text) outside fenced blocks, and the fenced blocks
    (first line number, language, lines)."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, list[str]]] = []
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = (m.group(1)[0], len(m.group(1)), m.group(2).lower(), n + 1, [])
            else:
                prose.append((n, line))
        else:
            char, length, lang, start, lines = fence
            if re.match(r"^ {0,3}" + re.escape(char) + "{" + str(length) + r",}\s*$", line):
                blocks.append((start, lang, lines))
                fence = None
            else:
                lines.append(line)
    if fence is not None:
        blocks.append((fence[3], fence[2], fence[4]))
    return prose, blocks


def strip_inline_code(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def github_slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # GitHub keeps letters, digits, _, - and spaces
    return text.replace(" ", "-")


@functools.cache
def anchors_of(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8")
    prose, _ = split_markdown(text)
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    previous = ""
    for _, line in prose:
        heading = None
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            heading = m.group(1)
        elif re.match(r"^ {0,3}(=+|-+)\s*$", line) and previous.strip() and not previous.lstrip().startswith(("|", "-", "*")):
            heading = previous.strip()  # a setext heading
        if heading is not None:
            slug = github_slug(heading)
            if slug in seen:
                seen[slug] += 1
                slug = f"{slug}-{seen[slug]}"
            else:
                seen[slug] = 0
            anchors.add(slug)
        for m in re.finditer(r"<a\s+[^>]*(?:name|id)=[\"']([^\"']+)[\"']", line):
            anchors.add(m.group(1))
        previous = line
    return frozenset(anchors)


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HREF = re.compile(r"<a\s+[^>]*href=[\"']([^\"']+)[\"']")


def check_links(path: Path, problems: list[str]) -> int:
    text = path.read_text(encoding="utf-8")
    prose, _ = split_markdown(text)
    count = 0
    for n, raw in prose:
        line = strip_inline_code(raw)
        targets = [m.group(1) for m in LINK.finditer(line)] + [m.group(1) for m in HREF.finditer(line)]
        m = REFERENCE.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto: …
            count += 1
            where = f"{path.relative_to(ROOT)}:{n}"
            file_part, _, anchor = target.partition("#")
            dest = path if file_part == "" else (path.parent / file_part).resolve()
            if file_part and not dest.exists():
                problems.append(f"{where}: link to {target}: {file_part} does not exist")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix.lower() != ".md":
                    problems.append(f"{where}: link to {target}: an anchor into a file that is not Markdown")
                elif anchor not in anchors_of(dest):
                    problems.append(
                        f"{where}: link to {target}: no heading of {dest.relative_to(ROOT)} has the anchor #{anchor}"
                    )
    return count


# ---- commands ----------------------------------------------------------------------------


class Binaries:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.missing: set[str] = set()

    @functools.cache
    def help(self, program: str, path: tuple[str, ...]) -> str | None:
        exe = self.bin_dir / program
        if not exe.exists():
            self.missing.add(program)
            return None
        out = subprocess.run([str(exe), *path, "--help"], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            return None
        return out.stdout

    @functools.cache
    def parsed(self, program: str, path: tuple[str, ...]) -> tuple[set[str], dict[str, bool]] | None:
        """The subcommands and options (option → takes a value) of one help text."""
        text = self.help(program, path)
        if text is None:
            return None
        commands: set[str] = set()
        options: dict[str, bool] = {}
        section = None
        for line in text.split("\n"):
            if re.match(r"^\S.*:\s*$", line):
                section = line.strip().rstrip(":").lower()
                continue
            if section == "commands":
                m = re.match(r"^\s{2}(\S+)", line)
                if m:
                    commands.add(m.group(1).rstrip(","))
            m = re.match(r"^\s+(?:(-\w),\s+)?(--[\w-]+)(?:[ =](<[^>]+>|\[[^\]]+\]))?", line)
            if m:
                takes_value = m.group(3) is not None
                options[m.group(2)] = takes_value
                if m.group(1):
                    options[m.group(1)] = takes_value
            m = re.match(r"^\s+(-\w)(?:\s+(<[^>]+>))?\s{2,}", line)
            if m and m.group(1) not in options:
                options[m.group(1)] = m.group(2) is not None
        options.setdefault("--help", False)
        options.setdefault("-h", False)
        return commands, options


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell snippet, as words (pipes, lists and $(…) split apart)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;()<>")
    lexer.commenters = "#"
    lexer.whitespace_split = True
    words: list[str] = []
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote in a fragment: fall back to whitespace
        words = text.split()
    commands: list[list[str]] = [[]]
    for w in words:
        if w and set(w) <= set("|&;()<>"):
            commands.append([])
        else:
            commands[-1].append(w.replace("$", "") if w.startswith("$(") else w)
    return [c for c in commands if c]


def program_of(words: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) when the words run outboxctl or outboxd, else None."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]  # VAR=value prefixes
    while words and words[0] in ("exec", "time", "sudo", "$"):
        words = words[1:]
    if not words:
        return None
    first = words[0]
    if first == "cargo" and len(words) > 1 and words[1] == "run":
        if "--bin" not in words:
            return None
        binary = words[words.index("--bin") + 1] if words.index("--bin") + 1 < len(words) else ""
        if binary not in PROGRAMS:
            return None
        rest = words[words.index("--") + 1 :] if "--" in words else []
        return binary, rest
    name = first.rsplit("/", 1)[-1]
    if name in PROGRAMS and (first == name or "target/" in first or first.startswith("./")):
        return name, words[1:]
    return None


def check_command(binaries: Binaries, program: str, args: list[str]) -> list[str]:
    """What is wrong with one command line, in words."""
    path: tuple[str, ...] = ()
    parsed = binaries.parsed(program, path)
    if parsed is None:
        return []  # reported once as a missing binary
    commands, options = parsed
    wrong: list[str] = []
    i = 0
    positional_seen = False
    while i < len(args):
        word = args[i].strip("[]")
        i += 1
        if word in ("", "…", "...") or word == "--":
            if word == "--":
                break
            continue
        if word.startswith("-") and word != "-":
            flag = word.split("=", 1)[0]
            if re.match(r"^-\w\w+$", flag):  # -abc: several short flags
                flags = [f"-{c}" for c in flag[1:]]
            else:
                flags = [flag]
            for f in flags:
                if f not in options:
                    where = " ".join((program, *path))
                    wrong.append(f"`{where}` has no option {f}")
                elif options[f] and "=" not in word and f == flags[-1]:
                    i += 1  # its value
            continue
        if commands and not positional_seen:
            if word in commands:
                path = (*path, word)
                parsed = binaries.parsed(program, path)
                if parsed is None:
                    wrong.append(f"`{' '.join((program, *path))} --help` fails")
                    return wrong
                commands, options = parsed
                continue
            if word != "help":
                wrong.append(f"`{' '.join((program, *path))}` has no subcommand {word}")
                return wrong
        positional_seen = True
    return wrong


def inline_spans(line: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", line)]


def check_commands(path: Path, binaries: Binaries, problems: list[str]) -> int:
    text = path.read_text(encoding="utf-8")
    prose, blocks = split_markdown(text)
    snippets: list[tuple[int, str]] = []
    for n, line in prose:
        for span in inline_spans(line):
            snippets.append((n, span))
    for start, lang, lines in blocks:
        if lang not in SHELL_FENCES:
            continue
        joined: list[tuple[int, str]] = []
        current, first = "", start
        for k, line in enumerate(lines):
            if lang == "console":
                if not line.startswith("$ ") and not current:
                    continue  # output
                line = line[2:] if line.startswith("$ ") and not current else line
            if not current:
                first = start + k
            if line.rstrip().endswith("\\"):
                current += line.rstrip()[:-1] + " "
                continue
            joined.append((first, current + line))
            current = ""
        if current:
            joined.append((first, current))
        in_heredoc = None
        for n, line in joined:
            if in_heredoc:
                if line.strip() == in_heredoc:
                    in_heredoc = None
                continue
            m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
            snippets.append((n, line))
            if m:
                in_heredoc = m.group(1)
    count = 0
    for n, snippet in snippets:
        for words in simple_commands(snippet):
            found = program_of(words)
            if found is None:
                continue
            count += 1
            program, args = found
            for wrong in check_command(binaries, program, args):
                problems.append(f"{path.relative_to(ROOT)}:{n}: {wrong} (in: {snippet.strip()})")
    return count


# ---- vocabulary --------------------------------------------------------------------------

GLOSSARY = ROOT / "docs" / "glossary.md"
# Code and documentation that must speak the glossary's words, as git lists them (tracked or
# new, not ignored): decisions are history, and generated code follows the wire contract.
VOCABULARY_ROOTS = ("server/src/", "client/src/", "tests/src/", "clients/", "docs/", "README.md")
VOCABULARY_SUFFIXES = (".rs", ".sql", ".py", ".ts", ".md")
VOCABULARY_EXEMPT = ("docs/adr/", "docs/glossary.md", "clients/python/src/outboxd/_proto/", "CHANGELOG")
# Names that still carry a retired word until the code that owns them is rewritten; each line
# says by what. Remove a line once its name is gone.
TEMPORARY: tuple[str, ...] = ()


def glossary_words() -> tuple[list[str], list[str]]:
    """The retired words and the kept names of docs/glossary.md."""
    text = GLOSSARY.read_text(encoding="utf-8")
    retired: list[str] = []
    kept: list[str] = []
    section = None
    for line in text.split("\n"):
        if line.startswith("<!-- retired-words"):
            section = "retired"
        elif line.startswith("<!-- kept-names"):
            section = "kept"
        elif section == "retired":
            if not line.startswith("|"):
                if retired:
                    section = None
                continue
            first = line.strip("|").split("|")[0]
            retired += re.findall(r"`([^`]+)`", first)
        elif section == "kept":
            if not line.startswith("- "):
                if kept:
                    section = None
                continue
            kept += re.findall(r"`([^`]+)`", line.split(": ", 1)[0])  # the names, before what they are
    return retired, kept


def retired_pattern(word: str) -> re.Pattern[str]:
    """A retired word in any case, a space, `_` or `-` standing for any of them, with an ending
    `s`, `es`, `ed` or `ing`, not inside a longer word."""
    parts = [re.escape(p) for p in re.split(r"[ _-]+", word)]
    return re.compile(
        r"(?<![A-Za-z0-9])" + r"[\s_-]+".join(parts) + r"(?:s|es|ed|ing)?(?![A-Za-z0-9])", re.IGNORECASE
    )


def vocabulary_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *VOCABULARY_ROOTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [
        ROOT / f
        for f in sorted(set(listed))
        if f.endswith(VOCABULARY_SUFFIXES) and not f.startswith(VOCABULARY_EXEMPT) and (ROOT / f).is_file()
    ]


def check_vocabulary(problems: list[str]) -> int:
    retired, kept = glossary_words()
    if not retired:
        problems.append(f"{GLOSSARY.relative_to(ROOT)}: no retired words found after <!-- retired-words")
        return 0
    patterns = [(w, retired_pattern(w)) for w in retired]
    # Longest first, so that a kept name inside another is masked as part of the longer one.
    masks = sorted({*kept, *TEMPORARY}, key=len, reverse=True)
    files = vocabulary_files()
    for path in files:
        text = path.read_text(encoding="utf-8")
        for name in masks:
            text = re.sub(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda m: "\x00" * len(m.group(0)), text)
        for word, pattern in patterns:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(
                    f"{path.relative_to(ROOT)}:{line}: retired word {m.group(0)!r} ({word!r}; see docs/glossary.md)"
                )
    return len(files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default="target/debug", help="where outboxd and outboxctl are (default: target/debug)")
    args = parser.parse_args()
    bin_dir = Path(args.bin_dir)
    if not bin_dir.is_absolute():
        bin_dir = (Path.cwd() / bin_dir).resolve()
    binaries = Binaries(bin_dir)
    problems: list[str] = []
    links = commands = 0
    files = doc_files()
    for f in files:
        links += check_links(f, problems)
        commands += check_commands(f, binaries, problems)
    vocabulary = check_vocabulary(problems)
    for program in sorted(binaries.missing):
        problems.append(f"{bin_dir / program} does not exist: build it, or pass --bin-dir")
    if problems:
        print(f"check-docs: {len(problems)} problem(s) in {len(files)} files:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(
        f"check-docs: {len(files)} files, {links} relative links and {commands} outboxd/outboxctl commands: all "
        f"resolve; {vocabulary} files without a retired word"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
