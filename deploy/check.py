"""Checks deploy/: the dashboard is valid Grafana JSON whose queries name only metrics that
outboxd exports (server/src/metrics.rs), and so do the alert rules."""
import json
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent
exported = set(re.findall(r'"(outboxd_[a-z_]+)"', (root.parent / "server/src/metrics.rs").read_text()))
suffixes = ("_bucket", "_sum", "_count")


def known(name):
    return name in exported or any(name.endswith(s) and name[: -len(s)] in exported for s in suffixes)


errors = []
dash = json.loads((root / "grafana/outboxd.json").read_text())
for key in ("title", "uid", "panels"):
    if key not in dash:
        errors.append(f"dashboard: missing {key!r}")
ids = [p.get("id") for p in dash.get("panels", [])]
if len(ids) != len(set(ids)):
    errors.append("dashboard: duplicate panel ids")
for panel in dash.get("panels", []):
    for target in panel.get("targets", []):
        for name in re.findall(r"\b(outboxd_[a-z_]+)", target.get("expr", "")):
            if not known(name):
                errors.append(f"dashboard panel {panel.get('title')!r}: unknown metric {name}")
for name in re.findall(r"\b(outboxd_[a-z_]+)", (root / "prometheus/alerts.yml").read_text()):
    if not known(name):
        errors.append(f"alerts.yml: unknown metric {name}")
for e in errors:
    print(e, file=sys.stderr)
print(f"deploy: {len(dash.get('panels', []))} panels, {len(exported)} exported metrics, {len(errors)} problems")
sys.exit(1 if errors else 0)
