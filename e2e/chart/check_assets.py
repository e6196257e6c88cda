#!/usr/bin/env python3
"""Checks of the chart's observability assets and rendered manifests, for e2e/chart.sh.

  check_assets.py dashboard DASHBOARD.json METRICS_RS EXPRS_OUT   (METRICS_RS: a.rs:b.rs)
  check_assets.py rules RENDERED.yaml METRICS_RS EXPRS_OUT
  check_assets.py parsed METRICS_RS < promql-check output
  check_assets.py manifests RENDERED.yaml EXPECT...      (EXPECT: Kind=count or Kind/name)
  check_assets.py env RENDERED.yaml RUST_SRC_DIR KNOWN_PENDING...

Each prints what it found and exits 1 with a list of problems when something is wrong.
EXPRS_OUT receives JSON lines {"name", "expr"} for e2e/chart/promql-check, which parses
them with Prometheus' own PromQL parser.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

METRIC_TOKEN = re.compile(r"\basyncd_[a-z0-9_]+")
# The metrics DESIGN.md names; each must be on the dashboard.
REQUIRED_ON_DASHBOARD = [
    "asyncd_task_submitted_total",
    "asyncd_task_dispatched_total",
    "asyncd_task_dispatch_delay_seconds",
    "asyncd_task_executed_total",
    "asyncd_task_execution_duration_seconds",
    "asyncd_task_retry_total",
    "asyncd_kafka_consumer_lag",
    "asyncd_mysql_pending_tasks",
    "asyncd_mysql_poll_duration_seconds",
    "asyncd_due_backlog",
    "asyncd_oldest_due_age_seconds",
]
REQUIRED_ALERTS = {
    "AsyncdDispatchDelayHigh": "asyncd_task_dispatch_delay_seconds",
    "AsyncdKafkaConsumerLagGrowing": "asyncd_kafka_consumer_lag",
    "AsyncdPendingTasksGrowing": "asyncd_mysql_pending_tasks",
    "AsyncdRetryRateHigh": "asyncd_task_retry_total",
    "AsyncdDueBacklogStale": "asyncd_oldest_due_age_seconds",
}
SEVERITIES = {"critical", "warning", "info"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def registered(metrics_rs):
    """Metric names registered in the metrics.rs files (METRICS_RS is a colon-separated
    list) -> the series names they expose."""
    text = "".join(open(p, encoding="utf-8").read() for p in metrics_rs.split(":") if p)
    names = set(re.findall(r'"(asyncd_[a-z0-9_]+)"', text))
    histograms = set(re.findall(r'histogram\(\s*"(asyncd_[a-z0-9_]+)"', text))
    histograms |= set(re.findall(r'HistogramOpts::new\(\s*"(asyncd_[a-z0-9_]+)"', text))
    series = {}
    for name in names:
        series[name] = name
        if name in histograms:
            for suffix in ("_bucket", "_sum", "_count"):
                series[name + suffix] = name
    if not names:
        sys.exit(f"no asyncd_ metric names found in {metrics_rs}")
    return series


def base_of(series_name, series):
    return series.get(series_name)


def grafana_to_promql(expr):
    """Replaces Grafana's variables with values so the parser sees plain PromQL."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    expr = expr.replace("${__range}", "1h").replace("$__range", "1h")
    expr = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)
    return expr


def walk_panels(panels):
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def dashboard(path, metrics_rs, exprs_out):
    problems = []
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    series = registered(metrics_rs)

    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no `datasource` template variable of type datasource (query: prometheus)")
    tt = variables.get("task_type")
    if not tt or tt.get("type") != "query":
        problems.append("no `task_type` query template variable")
    if not dash.get("uid") or not dash.get("title"):
        problems.append("dashboard needs a uid and a title")

    exprs = []
    for name, var in variables.items():
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query or "")
        if not m:
            problems.append(f"variable {name}: query is not label_values(selector, label): {query!r}")
            continue
        exprs.append({"name": f"variable:{name}", "expr": grafana_to_promql(m.group(1))})
        if var.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"variable {name}: datasource is not ${{datasource}}")

    ids = set()
    cells = {}
    panels = list(walk_panels(dash.get("panels", [])))
    graphs = 0
    for panel in panels:
        title = panel.get("title", "?")
        pid = panel.get("id")
        if pid in ids:
            problems.append(f"panel {title!r}: duplicate id {pid}")
        ids.add(pid)
        g = panel.get("gridPos", {})
        x, y, w, h = g.get("x", 0), g.get("y", 0), g.get("w", 0), g.get("h", 0)
        if w <= 0 or h <= 0 or x < 0 or x + w > 24:
            problems.append(f"panel {title!r}: gridPos {g} outside the 24-column grid")
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    problems.append(f"panel {title!r} overlaps panel {cells[(cx, cy)]!r}")
                    break
                cells[(cx, cy)] = title
            else:
                continue
            break
        if panel.get("type") == "row":
            continue
        graphs += 1
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {title!r}: datasource is not ${{datasource}}")
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"panel {title!r}: no queries")
        for t in targets:
            expr = t.get("expr", "")
            if not expr:
                problems.append(f"panel {title!r} target {t.get('refId')}: empty expr")
                continue
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"panel {title!r} target {t.get('refId')}: datasource is not ${{datasource}}")
            exprs.append({"name": f"panel:{title}:{t.get('refId')}", "expr": grafana_to_promql(expr)})

    # Every asyncd_ name anywhere in the dashboard (queries, descriptions) must exist.
    text = open(path, encoding="utf-8").read()
    used = set(METRIC_TOKEN.findall(text))
    unknown = sorted(n for n in used if n not in series)
    for n in unknown:
        problems.append(f"metric {n} is not registered in {metrics_rs}")
    queried = {series[n] for e in exprs for n in METRIC_TOKEN.findall(e["expr"]) if n in series}
    for n in REQUIRED_ON_DASHBOARD:
        if n not in queried:
            problems.append(f"no panel queries {n}")

    with open(exprs_out, "w", encoding="utf-8") as f:
        for e in exprs:
            f.write(json.dumps(e) + "\n")
    print(f"dashboard: {graphs} panels, {len(exprs)} queries, metrics used: {len(used)}, "
          f"variables: {', '.join(variables)}")
    return problems


def docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rules(path, metrics_rs, exprs_out):
    problems = []
    series = registered(metrics_rs)
    found = [d for d in docs(path) if d.get("kind") == "PrometheusRule"]
    if len(found) != 1:
        return [f"expected one PrometheusRule, found {len(found)}"]
    exprs = []
    alerts = {}
    for group in found[0]["spec"]["groups"]:
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            expr = str(rule.get("expr", ""))
            exprs.append({"name": f"rule:{name}", "expr": expr})
            for n in METRIC_TOKEN.findall(expr):
                if n not in series:
                    problems.append(f"{name}: metric {n} is not registered in {metrics_rs}")
            if "alert" not in rule:
                continue
            alerts[name] = expr
            if not DURATION.match(str(rule.get("for", ""))):
                problems.append(f"{name}: `for` missing or not a duration: {rule.get('for')!r}")
            if rule.get("labels", {}).get("severity") not in SEVERITIES:
                problems.append(f"{name}: severity label missing or not one of {sorted(SEVERITIES)}")
            ann = rule.get("annotations", {})
            for key in ("summary", "description"):
                if not ann.get(key):
                    problems.append(f"{name}: annotation {key} missing")
            for key, value in ann.items():
                if value.count("{{") != value.count("}}"):
                    problems.append(f"{name}: annotation {key} has unbalanced {{{{ }}}}")
                for n in METRIC_TOKEN.findall(value):
                    if n not in series:
                        problems.append(f"{name}: annotation {key} names unknown metric {n}")
    for alert, metric in REQUIRED_ALERTS.items():
        if alert not in alerts:
            problems.append(f"alert {alert} missing")
        elif metric not in alerts[alert]:
            problems.append(f"alert {alert} does not use {metric}")
    with open(exprs_out, "w", encoding="utf-8") as f:
        for e in exprs:
            f.write(json.dumps(e) + "\n")
    print(f"rules: {len(alerts)} alerts: {', '.join(alerts)}")
    return problems


def parsed(metrics_rs):
    """Metric names from promql-check's output must be registered in metrics.rs."""
    problems = []
    series = registered(metrics_rs)
    count = 0
    for line in sys.stdin:
        parts = line.rstrip("\n").split("\t", 2)
        if parts[0] != "ok":
            problems.append(line.strip())
            continue
        count += 1
        names = parts[2].split(",") if len(parts) > 2 and parts[2] else []
        if not names:
            problems.append(f"{parts[1]}: selects no metric")
        for n in names:
            if n not in series:
                problems.append(f"{parts[1]}: metric {n} is not registered in {metrics_rs}")
    print(f"parsed: {count} expressions, all metric names checked against "
          + ", ".join("/".join(p.split("/")[-3:]) for p in metrics_rs.split(":")))
    return problems


def manifests(path, expects):
    problems = []
    found = docs(path)
    kinds = {}
    names = set()
    for d in found:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        names.add(f'{d["kind"]}/{d["metadata"]["name"]}')
    for e in expects:
        if "=" in e:
            kind, count = e.split("=")
            if kinds.get(kind, 0) != int(count):
                problems.append(f"expected {count} {kind}, found {kinds.get(kind, 0)}")
        elif e.startswith("!"):
            if e[1:] in names:
                problems.append(f"unexpected {e[1:]}")
        elif e not in names:
            problems.append(f"missing {e}")
    print("kinds: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    return problems


def env(path, src_dir, pending):
    """Every ASYNCD_* variable given to an asyncd container (not the operator's) must be
    read by the Rust code, except the ones listed as pending."""
    problems = []
    text = ""
    for root, _, files in os.walk(src_dir):
        for name in files:
            if name.endswith(".rs"):
                text += open(os.path.join(root, name), encoding="utf-8").read()
    seen = set()
    for d in docs(path):
        spec = d.get("spec", {})
        pod = spec.get("template", {}).get("spec", {}) if d["kind"] in ("Deployment", "Job") else {}
        for c in pod.get("containers", []):
            if c["name"] == "operator":
                continue
            for e in c.get("env", []):
                if e["name"].startswith("ASYNCD_"):
                    seen.add(e["name"])
    if not seen:
        problems.append("no ASYNCD_* variables found in the rendering")
    missing = sorted(n for n in seen if f'"{n}"' not in text)
    for n in missing:
        if n in pending:
            print(f"note: {n} is not read by the Rust code yet (expected to come)")
        else:
            problems.append(f"{n} is set by the chart but read nowhere in {src_dir}")
    print(f"env: {', '.join(sorted(seen))}")
    return problems


def cli(path, binary):
    """Every asyncd container of the rendering starts with its args and environment: the
    real binary parses them (clap exits 2 on a usage error, such as two conflicting
    sources of job configs) and gets as far as opening the store, which is pointed at an
    unsupported URL so that it stops there."""
    problems = []
    runs = 0
    for d in docs(path):
        if d["kind"] not in ("Deployment", "Job"):
            continue
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            if c["name"] == "operator":
                continue
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            for e in c.get("env", []):
                # Secret and field references are resolved by the kubelet; any value will do.
                env[e["name"]] = str(e.get("value", "from-a-reference"))
            env["ASYNCD_STORE"] = "unsupported://chart-check"
            what = f"{d['kind']} {d['metadata']['name']} container {c['name']}"
            try:
                run = subprocess.run([binary, *c.get("args", [])], env=env,
                                     capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                problems.append(f"{what}: still running after 60 s")
                continue
            runs += 1
            if run.returncode != 1 or "is not supported" not in run.stderr:
                problems.append(f"{what}: exit {run.returncode}, expected to reach the store; "
                                f"stderr: {run.stderr.strip()[-400:]}")
    if runs == 0:
        problems.append("no asyncd containers found in the rendering")
    print(f"cli: ran {runs} containers")
    return problems


def operator_cli(path, binary):
    """The operator container of the rendering: the real asyncd-operator parses its args
    and environment (clap exits 2 on a usage error) and gets as far as looking for a
    cluster, which is not there (an empty KUBECONFIG file, no in-cluster variables)."""
    problems = []
    runs = 0
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        open(kubeconfig, "w").close()
        for d in docs(path):
            if d["kind"] != "Deployment":
                continue
            for c in d["spec"]["template"]["spec"].get("containers", []):
                if c["name"] != "operator":
                    continue
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": kubeconfig,
                       "HOME": tmp}
                for e in c.get("env", []):
                    env[e["name"]] = str(e.get("value", "from-a-reference"))
                what = f"{d['kind']} {d['metadata']['name']} container {c['name']}"
                try:
                    run = subprocess.run([binary, *c.get("args", [])], env=env,
                                         capture_output=True, text=True, timeout=60)
                except subprocess.TimeoutExpired:
                    problems.append(f"{what}: still running after 60 s")
                    continue
                runs += 1
                if run.returncode != 1 or "kubeconfig" not in run.stderr:
                    problems.append(f"{what}: exit {run.returncode}, expected to look for a cluster; "
                                    f"stderr: {run.stderr.strip()[-400:]}")
    if runs == 0:
        problems.append("no operator container found in the rendering")
    print(f"cli: ran {runs} operator containers")
    return problems


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "dashboard":
        problems = dashboard(*args)
    elif cmd == "rules":
        problems = rules(*args)
    elif cmd == "parsed":
        problems = parsed(*args)
    elif cmd == "manifests":
        problems = manifests(args[0], args[1:])
    elif cmd == "cli":
        problems = cli(*args)
    elif cmd == "operator-cli":
        problems = operator_cli(*args)
    elif cmd == "env":
        problems = env(args[0], args[1], set(args[2:]))
    else:
        sys.exit(f"unknown command {cmd}")
    for p in problems:
        print(f"problem: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
