"""deploy/kubernetes: every object validated offline, with checks that fail on a
wrong field, and the consistency the deployment relies on.

- Kubernetes objects against the bundled OpenAPI-derived schemas of the
  `kubernetes-validate` package, strict (unknown fields are errors, as under
  kubectl's default --validate=strict).
- KEDA ScaledObject / TriggerAuthentication against JSON schemas generated from
  KEDA's CRDs (tests/deploy/schemas, see tests/deploy/keda_crd_schema.py), plus a
  per-trigger-type schema for trigger `metadata`, which KEDA's CRD leaves as a
  free map of strings.
- The rendered kustomizations (`kubectl kustomize`, when kubectl is installed;
  the plain YAML files are validated either way).

No cluster is needed (and none is reachable here): nothing is applied.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inferq.schemas import keys

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUSTOMIZATIONS = ["base", "overlays/in-cluster-redis", "overlays/external-redis"]
K8S_VERSIONS = ["1.29", "1.32"]  # oldest supported and a current minor
REDIS_TRIGGERS = {"redis-streams", "redis-cluster-streams", "redis-sentinel-streams"}
# Worker.shutdown (gpuworker/service/worker.py) after the drain timeout: intake
# join (block_ms + 5 s), publisher join (20 s), lease join (5 s).
SHUTDOWN_OVERHEAD_S = 5 + 20 + 5


# -- loading -------------------------------------------------------------------
def yaml_objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def plain_objects() -> list[tuple[str, dict]]:
    out = []
    for p in manifest_files():
        for d in yaml_objects(p):
            out.append((f"{p.relative_to(K8S)}:{d['kind']}/{d['metadata']['name']}", d))
    return out


def render(kustomization: str) -> list[dict]:
    r = subprocess.run(["kubectl", "kustomize", str(K8S / kustomization)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def kustomize_files(kustomization: str) -> list[dict]:
    """The plain-YAML equivalent of a render (resources and components, no
    patches), for machines without kubectl."""
    k = yaml.safe_load((K8S / kustomization / "kustomization.yaml").read_text())
    out = []
    for ref in k.get("resources", []) + k.get("components", []):
        p = (K8S / kustomization / ref).resolve()
        if p.is_dir():
            out += kustomize_files(str(p.relative_to(K8S)))
        else:
            out += yaml_objects(p)
    return out


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(deploy: dict, name: str) -> dict:
    return next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# -- validators ----------------------------------------------------------------
def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


KEDA_SCHEMAS = {
    "ScaledObject": _schema("keda.sh_scaledobject_v1alpha1.json"),
    "TriggerAuthentication": _schema("keda.sh_triggerauthentication_v1alpha1.json"),
}
TRIGGER_METADATA = _schema("keda_trigger_metadata.json")["triggers"]


def validation_errors(obj: dict) -> list[str]:
    """Every reason ``obj`` is invalid; empty when it is valid."""
    api = obj.get("apiVersion", "")
    if api.startswith("keda.sh/"):
        schema = KEDA_SCHEMAS.get(obj.get("kind"))
        if schema is None:
            return [f"no schema for KEDA kind {obj.get('kind')!r}"]
        v = jsonschema.Draft202012Validator(schema)
        errs = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(obj)]
        if obj.get("kind") == "ScaledObject" and not errs:
            spec = obj["spec"]
            # The CRD's CEL rule, which JSON schema cannot express.
            if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
                errs.append("minReplicaCount must be less than or equal to maxReplicaCount")
            for i, t in enumerate(spec["triggers"]):
                ts = TRIGGER_METADATA.get(t["type"])
                if ts is None:
                    errs.append(f"triggers/{i}: no metadata schema for trigger type {t['type']!r}")
                    continue
                for e in jsonschema.Draft202012Validator(ts).iter_errors(t["metadata"]):
                    errs.append(f"triggers/{i}/metadata/{'/'.join(map(str, e.absolute_path))}: {e.message}")
        return errs
    errs = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errs.append(f"k8s {version}: {'/'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errs.append(f"k8s {version}: {e}")
    return errs


# -- every object valid --------------------------------------------------------
@pytest.mark.parametrize("where,obj", plain_objects(), ids=[w for w, _ in plain_objects()])
def test_every_manifest_object_is_valid(where, obj):
    assert validation_errors(obj) == []


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rendered_kustomization_is_valid(kustomization):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the rendered (patched) output is not checked; "
                    "test_every_manifest_object_is_valid still validates every plain YAML object")
    objs = render(kustomization)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "ConfigMap", "ScaledObject", "TriggerAuthentication", "Namespace"} <= kinds
    for o in objs:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "inferq", f"{o['kind']}/{o['metadata']['name']}"
        assert validation_errors(o) == [], f"{o['kind']}/{o['metadata']['name']}"
    check_consistency(objs)


def test_plain_files_are_consistent_without_kubectl():
    for k in KUSTOMIZATIONS[:2]:  # the overlays without patches render to exactly their files
        check_consistency(kustomize_files(k))


# -- the checks fail on a wrong field -----------------------------------------
def _base_objects() -> list[dict]:
    return kustomize_files("base")


def _mutate_scaledobject(f):
    so = copy.deepcopy(one(_base_objects(), "ScaledObject", "inferq-worker"))
    f(so)
    return so


def _mutate_worker(f):
    d = copy.deepcopy(one(_base_objects(), "Deployment", "inferq-worker"))
    f(d)
    return d


def _rename(d: dict, old: str, new: str) -> None:
    d[new] = d.pop(old)


NEGATIVE = {
    "trigger metadata consumerGroupp": lambda: _mutate_scaledobject(
        lambda so: _rename(so["spec"]["triggers"][0]["metadata"], "consumerGroup", "consumerGroupp")),
    "trigger metadata lagCount as an integer": lambda: _mutate_scaledobject(
        lambda so: so["spec"]["triggers"][0]["metadata"].__setitem__("lagCount", 64)),
    "trigger streamLength beside consumerGroup (KEDA would ignore it)": lambda: _mutate_scaledobject(
        lambda so: so["spec"]["triggers"][0]["metadata"].__setitem__("streamLength", "10")),
    "trigger with a plain-text password": lambda: _mutate_scaledobject(
        lambda so: so["spec"]["triggers"][0]["metadata"].__setitem__("password", "hunter2")),
    "spec minReplicaCounts": lambda: _mutate_scaledobject(lambda so: _rename(so["spec"], "minReplicaCount",
                                                                            "minReplicaCounts")),
    "minReplicaCount above maxReplicaCount": lambda: _mutate_scaledobject(
        lambda so: so["spec"].__setitem__("minReplicaCount", 99)),
    "authenticationRef kind typo": lambda: _mutate_scaledobject(
        lambda so: so["spec"]["triggers"][0]["authenticationRef"].__setitem__("kind", "TriggerAuth")),
    "unknown trigger type": lambda: _mutate_scaledobject(
        lambda so: so["spec"]["triggers"][0].__setitem__("type", "redis-stream")),
    "TriggerAuthentication secretTargetRef keyy": lambda: (lambda ta: (
        _rename(ta["spec"]["secretTargetRef"][0], "key", "keyy"), ta)[1])(
        copy.deepcopy(one(_base_objects(), "TriggerAuthentication", "inferq-redis"))),
    "Deployment readinessProbe httpGet portt": lambda: _mutate_worker(
        lambda d: _rename(container(d, "worker")["readinessProbe"]["httpGet"], "port", "portt")),
    "Deployment terminationGracePeriodSeconds as a string": lambda: _mutate_worker(
        lambda d: d["spec"]["template"]["spec"].__setitem__("terminationGracePeriodSeconds", "90")),
    "Deployment env valueFrom fieldRef typo": lambda: _mutate_worker(
        lambda d: _rename(next(e for e in container(d, "worker")["env"] if e["name"] == "INFERQ_WORKER_ID")
                          ["valueFrom"], "fieldRef", "fieldReff")),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_a_wrong_field_fails_validation(case):
    assert validation_errors(NEGATIVE[case]()) != [], f"{case!r} was accepted"


def test_the_unmutated_objects_pass():
    # The negative cases above start from these; they must be valid to begin with.
    for o in _base_objects():
        assert validation_errors(o) == [], f"{o['kind']}/{o['metadata']['name']}"


# -- consistency ---------------------------------------------------------------
def _settings_env_names() -> set[str]:
    from inferq.gpuworker.service.settings import WorkerSettings
    from inferq.producer.gateway.config import GatewaySettings
    from inferq.producer.maintenance import MaintenanceSettings
    from inferq.producer.settings import ProducerSettings

    names = set()
    for cls in (WorkerSettings, ProducerSettings, GatewaySettings, MaintenanceSettings):
        prefix = cls.model_config.get("env_prefix", "")
        names |= {(prefix + f).upper() for f in cls.model_fields}
    return names


def check_consistency(objs: list[dict]) -> None:
    cm = one(objs, "ConfigMap", "inferq-config")["data"]
    worker = one(objs, "Deployment", "inferq-worker")
    gateway = one(objs, "Deployment", "inferq-gateway")
    so = one(objs, "ScaledObject", "inferq-worker")
    ta_names = {o["metadata"]["name"] for o in objs if o["kind"] == "TriggerAuthentication"}
    wspec = worker["spec"]["template"]["spec"]
    wc = container(worker, "worker")

    # Every INFERQ_* key in the ConfigMap is a real setting (a typo is not silently ignored).
    known = _settings_env_names()
    unknown = sorted(k for k in cm if k not in known)
    assert not unknown, f"ConfigMap keys no inferq settings class reads: {unknown}"

    # SIGTERM drain: the kill comes after the drain timeout and the shutdown steps.
    drain = float(cm["INFERQ_DRAIN_TIMEOUT"])
    block_s = int(cm.get("INFERQ_BLOCK_MS", "1000")) / 1000
    grace = wspec["terminationGracePeriodSeconds"]
    assert grace > drain + block_s + SHUTDOWN_OVERHEAD_S, (grace, drain)

    # KEDA reads exactly the stream and group the workers use.
    model = cm.get("INFERQ_SERVED_MODEL_NAME") or keys.DEFAULT_MODEL
    redis_url = urlparse(cm["INFERQ_REDIS_URL"])
    triggers = so["spec"]["triggers"]
    redis_triggers = [t for t in triggers if t["type"] in REDIS_TRIGGERS]
    assert redis_triggers
    for t in redis_triggers:
        md = t["metadata"]
        assert md["stream"] == keys.jobs(model)
        if "consumerGroup" in md:
            assert md["consumerGroup"] == keys.JOBS_GROUP
        assert md["address"] == f"{redis_url.hostname}:{redis_url.port or 6379}", "KEDA watches another Redis"
        assert md.get("databaseIndex", "0") == (redis_url.path.strip("/") or "0")
        assert t["authenticationRef"]["name"] in ta_names
    by_mode = {next(m for m in ("lagCount", "pendingEntriesCount", "streamLength") if m in t["metadata"]): t
               for t in redis_triggers}
    assert set(by_mode) == {"lagCount", "pendingEntriesCount", "streamLength"}
    # One queued job wakes a worker; a replica stays while it holds work.
    assert by_mode["lagCount"]["metadata"]["activationLagCount"] == "0"
    assert by_mode["streamLength"]["metadata"].get("activationLagCount", "0") == "0"
    assert so["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert so["spec"]["minReplicaCount"] in (0, 1)
    # A replica is "full" at max_num_seqs jobs.
    per_replica = cm["INFERQ_MAX_NUM_SEQS"]
    assert by_mode["pendingEntriesCount"]["metadata"]["pendingEntriesCount"] == per_replica
    assert by_mode["streamLength"]["metadata"]["streamLength"] == per_replica

    # KEDA's HPA owns the worker count: a `replicas` here would be re-applied on
    # every `kubectl apply` (and drain workers until KEDA scales back).
    assert "replicas" not in worker["spec"]

    # Worker: GPU, identity, probes on the metrics port the worker serves.
    res = wc["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e for e in wc.get("env", [])}
    assert env["INFERQ_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["INFERQ_DEVICE"]["value"] == "cuda"  # no silent fallback to the CPU
    args = wc["args"]
    metrics_port = int(args[args.index("--metrics-port") + 1])
    ports = {p["name"]: p["containerPort"] for p in wc["ports"]}
    # Liveness is the engine loop's /health (a stuck engine still serves /metrics).
    for probe, path in (("startupProbe", "/metrics"), ("readinessProbe", "/metrics"), ("livenessProbe", "/health")):
        hg = wc[probe]["httpGet"]
        assert hg["path"] == path
        assert ports[hg["port"]] == metrics_port if isinstance(hg["port"], str) else hg["port"] == metrics_port

    # Gateway: readiness on /ready, liveness on /health.
    gc = container(gateway, "gateway")
    assert gc["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gc["livenessProbe"]["httpGet"]["path"] == "/health"
    svc = one(objs, "Service", "inferq-gateway")
    assert svc["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()

    # The gateway refuses a non-loopback address without API keys
    # (producer/gateway/config.py check_exposure): the keys come from a required Secret.
    genv = {e["name"]: e for e in gc.get("env", [])}
    keys_ref = genv["INFERQ_GATEWAY_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert not keys_ref.get("optional"), "without keys the gateway does not start on 0.0.0.0"
    # Its metrics port is not the Service's.
    gports = {p["name"]: p["containerPort"] for p in gc["ports"]}
    assert int(genv["INFERQ_GATEWAY_METRICS_PORT"]["value"]) == gports["metrics"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {gports["http"]}

    # The Redis password: one Secret, one key, everywhere (pods, KEDA, Redis).
    refs = set()
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref and e["name"] in ("INFERQ_REDIS_PASSWORD", "REDIS_PASSWORD"):
                        refs.add((ref["name"], ref["key"]))
        if o["kind"] == "TriggerAuthentication":
            refs |= {(r["name"], r["key"]) for r in o["spec"]["secretTargetRef"]}
    assert refs == {("inferq-redis", "password")}, refs

    redis_sts = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "inferq-redis"]
    if redis_sts:
        rc = container(redis_sts[0], "redis")
        line = " ".join(rc.get("command", []) + rc.get("args", []))
        assert "--appendonly yes" in line and "--maxmemory-policy noeviction" in line
        assert re.search(r"--maxmemory \d+[kmg]b", line), "noeviction needs a maxmemory below the memory limit"
        # The password never on a command line (`ps` shows it): a config file written at start.
        assert "REDIS_PASSWORD" in line and "--requirepass" not in line and "-a " not in line
        for probe in ("readinessProbe", "livenessProbe"):
            cmd = " ".join(rc[probe].get("exec", {}).get("command", []))
            assert " -a " not in cmd
        svc = one(objs, "Service", "inferq-redis")
        assert redis_url.hostname.split(".")[0] == svc["metadata"]["name"]
        assert redis_url.port == svc["spec"]["ports"][0]["port"]


def test_consistency_check_catches_a_drift():
    """check_consistency itself fails on the mistakes it exists for."""
    def broken(f):
        objs = copy.deepcopy(kustomize_files("overlays/in-cluster-redis"))
        f(objs)
        with pytest.raises(AssertionError):
            check_consistency(objs)

    def so(objs):
        return one(objs, "ScaledObject", "inferq-worker")

    broken(lambda o: one(o, "ConfigMap", "inferq-config")["data"].__setitem__("INFERQ_DRAIN_TIMEOUT", "85"))
    broken(lambda o: so(o)["spec"]["triggers"][0]["metadata"].__setitem__("stream", "inferq:jobs:SmolLM2"))
    broken(lambda o: so(o)["spec"]["triggers"][0]["metadata"].__setitem__("consumerGroup", "workers"))
    broken(lambda o: one(o, "ConfigMap", "inferq-config")["data"].__setitem__("INFERQ_SERVED_MODEL_NAME", "llama"))
    broken(lambda o: one(o, "ConfigMap", "inferq-config")["data"].__setitem__("INFERQ_DRAIN_TIMEOUTT", "30"))
    broken(lambda o: so(o)["spec"]["triggers"][0]["metadata"].__setitem__("activationLagCount", "5"))


@pytest.mark.parametrize("path", sorted((K8S / "alternatives").glob("*.yaml")), ids=lambda p: p.name)
def test_alternative_triggers_name_the_same_stream(path):
    objs = yaml_objects(path)
    so = one(objs, "ScaledObject", "inferq-worker")
    ta = {o["metadata"]["name"] for o in objs if o["kind"] == "TriggerAuthentication"}
    for t in so["spec"]["triggers"]:
        md = t["metadata"]
        if t["type"] in REDIS_TRIGGERS:
            assert md["stream"] == keys.jobs(keys.DEFAULT_MODEL)
            assert md.get("consumerGroup", keys.JOBS_GROUP) == keys.JOBS_GROUP
            assert md.get("activationLagCount") == "0"
            assert t["authenticationRef"]["name"] in ta
        elif t["type"] == "prometheus":
            assert f'model="{keys.DEFAULT_MODEL}"' in md["query"]
            assert md["activationThreshold"] == "0"


def test_docs_name_the_secret_the_manifests_use():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "create secret generic inferq-redis --from-literal=password=" in doc
    for k in KUSTOMIZATIONS[1:]:
        assert f"kubectl apply -k deploy/kubernetes/{k}" in doc


def test_crd_to_schema_conversion_is_strict():
    """tests/deploy/keda_crd_schema.py: what makes the KEDA schemas above strict."""
    from tests.deploy import keda_crd_schema as mod

    crd = {
        "metadata": {"name": "things.example.com"},
        "spec": {"group": "example.com", "names": {"kind": "Thing"}, "versions": [{"name": "v1", "schema": {
            "openAPIV3Schema": {"type": "object", "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {"type": "object", "description": "d", "properties": {
                    "count": {"x-kubernetes-int-or-string": True},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"a": {"type": "string"}}},
                }},
                "status": {"type": "object"},
            }}}}]},
    }
    schema = mod.convert(crd, "test")
    v = jsonschema.Draft202012Validator(schema)
    ok = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "x"},
          "spec": {"count": "50%", "labels": {"any": "thing"}, "free": {"a": "1", "b": 2}}}
    assert list(v.iter_errors(ok)) == []
    assert not v.is_valid({**ok, "spec": {**ok["spec"], "countt": 1}})      # strict object
    assert not v.is_valid({**ok, "spec": {**ok["spec"], "count": 1.5}})     # int-or-string
    assert not v.is_valid({**ok, "status": {}})                             # status dropped
    assert not v.is_valid({**ok, "kind": "Other"})
    assert "description" not in json.dumps(schema)
