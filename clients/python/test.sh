#!/usr/bin/env bash
# The Python client's checks: the committed generated code matches proto/, mypy --strict on the
# package, then pytest against real outboxd processes and PostgreSQL (OUTBOX_TEST_DATABASE_URL,
# default postgres://postgres@127.0.0.1:5432/postgres; OUTBOXD_BIN, default target/debug/outboxd,
# built if missing). The virtualenv lives under the repository's target/ (git-ignored) and is
# reused; OUTBOXD_PY_VENV puts it elsewhere. Arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${OUTBOXD_PY_VENV:-$repo/target/py-client-venv}"

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip install --disable-pip-version-check -q)
"${pip[@]}" "$here[test]"
# The package as the tree has it now (pip may keep an earlier build of the same version).
"${pip[@]}" --force-reinstall --no-deps "$here"

"$py" "$here/generate.py" --check
# The statements and topic grammar shared with the other clients (contract/, ADR 0084).
"$py" "$repo/scripts/contract.py" --check
(cd "$here" && "$py" -m mypy && "$py" -m mypy --strict tests bench)
# The tests import the installed package (src/ is not on the path), as a user would.
cd "$here"
"$py" -m pytest -p no:cacheprovider "$@"
