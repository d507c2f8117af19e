"""deploy/grafana: the dashboard JSON has Grafana's structure (panels with a
type, a place on the grid, a Prometheus datasource and queries), every query
names a metric the code exports (checked against the worker's and the
gateway's own registries, so a renamed metric fails here), and the compose
profile "monitoring" provisions it with Prometheus."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
PANEL_TYPES = {"timeseries", "heatmap", "stat", "gauge", "bargauge", "table", "text", "row"}
# PromQL words that look like metric names but are not.
PROMQL = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "min", "avg", "le", "without", "count",
          "label_values", "irate", "topk", "on", "ignoring", "group_left"}


def exported_names() -> set[str]:
    """Every sample name the two registries can expose (a histogram's _bucket/_sum/_count, a counter's _total)."""
    from inferq.gpuworker.metrics import WorkerMetrics
    from inferq.producer.gateway.metrics import GatewayMetrics

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",), "info": ("_info",), "summary": ("", "_sum", "_count")}
    names = set()
    for registry in (WorkerMetrics("m").registry, GatewayMetrics().registry):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def metrics_in(expr: str) -> set[str]:
    expr = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', "", expr)  # label lists
    expr = re.sub(r'label_values\(([^,)]+),[^)]*\)', r"\1", expr)  # Grafana's: (metric, label)
    expr = re.sub(r'\{[^}]*\}', "", expr)  # label matchers
    expr = re.sub(r'\[[^\]]*\]', "", expr)  # ranges
    expr = re.sub(r'"[^"]*"', "", expr)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) - PROMQL
    return {w for w in words if not re.fullmatch(r"\d.*", w) and not w.startswith("$")}


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def test_there_is_a_dashboard():
    assert DASHBOARDS, "no dashboard JSON under deploy/grafana/dashboards"


def test_the_dashboards_have_grafanas_structure():
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
        assert dash["uid"] and dash["title"]
        ids = [p["id"] for p in panels(dash)]
        assert len(ids) == len(set(ids)), "panel ids must be unique"
        graphs = [p for p in panels(dash) if p["type"] != "row"]
        assert len(graphs) >= 15
        for p in panels(dash):
            assert p["type"] in PANEL_TYPES, p["type"]
            assert p["title"]
            g = p["gridPos"]
            assert {"h", "w", "x", "y"} <= set(g) and 0 <= g["x"] and g["x"] + g["w"] <= 24
        for p in graphs:
            assert p["datasource"] == {"type": "prometheus", "uid": "inferq-prometheus"}, p["title"]
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
            for t in p["targets"]:
                assert t["expr"].strip() and t["datasource"]["uid"] == "inferq-prometheus"
        kinds = {p["type"] for p in graphs}
        assert {"timeseries", "heatmap", "stat"} <= kinds


def test_every_query_names_an_exported_metric():
    exported = exported_names()
    used = set()
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        exprs = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
        exprs += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
                  for v in dash.get("templating", {}).get("list", [])]
        for expr in exprs:
            names = metrics_in(expr)
            assert names, f"no metric in {expr!r}"
            missing = names - exported
            assert not missing, f"{path.name}: {expr!r} names {sorted(missing)}, which no registry exports"
            used |= names
    # The list: throughput, TTFT/ITL/queue wait, KV, preemptions, backlog per lane, DLQ, fenced refusals.
    for needed in ("inferq:generation_tokens_total", "inferq:time_to_first_token_seconds_bucket",
                   "inferq:inter_token_latency_seconds_bucket", "inferq:request_queue_time_seconds_bucket",
                   "inferq:kv_cache_usage_perc", "inferq:num_preemptions_total", "inferq_queue_class_waiting",
                   "inferq_queue_tenant_waiting", "inferq_dlq_size", "inferq:fenced_refusals_total"):
        assert needed in used, needed


def test_the_checker_catches_a_wrong_name():
    assert metrics_in('sum by (le) (rate(inferq:no_such_metric_bucket{model_name=~"$model"}[1m]))') == \
        {"inferq:no_such_metric_bucket"}
    assert "inferq:no_such_metric_bucket" not in exported_names()


def test_the_monitoring_profile_provisions_prometheus_and_grafana():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    graf = compose["services"]["grafana"]
    assert graf["profiles"] == ["monitoring"] == compose["services"]["prometheus"]["profiles"]
    assert re.search(r":\d+\.\d+\.\d+$", graf["image"])
    assert all(p.startswith("127.0.0.1:") for p in graf["ports"])
    mounts = {m.split(":")[0]: m.split(":")[1] for m in graf["volumes"] if m.startswith("./")}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "inferq-prometheus" and ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "inferq.yml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
