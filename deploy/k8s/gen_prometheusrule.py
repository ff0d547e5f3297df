"""Writes prometheusrule.yaml, the Prometheus Operator's PrometheusRule, from
../prometheus/alerts.yml, the one source of outboxd's alert rules (checked and unit-tested there
with promtool). `--check` writes nothing and fails if the file is out of date (CI runs it)."""
import pathlib
import sys

import yaml

here = pathlib.Path(__file__).resolve().parent
source = here.parent / "prometheus/alerts.yml"
target = here / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yml by deploy/k8s/gen_prometheusrule.py: edit
# alerts.yml and run `python3 deploy/k8s/gen_prometheusrule.py`. CI fails when they differ.
"""


def render():
    rules = yaml.safe_load(source.read_text())
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "outboxd", "labels": {"app.kubernetes.io/component": "server"}},
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


if __name__ == "__main__":
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not target.exists() or target.read_text() != text:
            print(f"{target.name} is out of date with alerts.yml: run python3 deploy/k8s/gen_prometheusrule.py",
                  file=sys.stderr)
            sys.exit(1)
        print(f"{target.name} matches alerts.yml")
    else:
        target.write_text(text)
        print(f"wrote {target}")
