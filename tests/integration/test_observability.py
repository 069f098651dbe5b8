"""Observability end to end (docs/operations.md, "Metrics", "Health", "Alerts"): the alert rules pass
promtool's check and their unit tests; a real Prometheus scrapes a kmirrord that mirrors a topic
from a source of the module's own, and every expression of the Grafana dashboard and of the alert
rules returns data there (a panel or rule naming a metric kmirrord does not serve fails); when the
source stops, kmirror_mirror_source_reachable goes to 0, the last Fetch time stands still, and
/healthz reports the source while it answers 200 (and /readyz too)."""

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest
import yaml

from harness import KafkaCluster, free_port
from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import main_release_only, produce_records
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = main_release_only  # kmirrord's own endpoints: the same on every release

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")
RULES = os.path.join(DOCS, "prometheus", "kmirror-rules.yml")
RULES_TEST = os.path.join(DOCS, "prometheus", "kmirror-rules.test.yml")
DASHBOARD = os.path.join(DOCS, "grafana", "kmirror.json")
JOB = "kmirrord"  # the scrape job the rules' KmirrorInstanceDown reads


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is not installed: run scripts/install-deps.sh (Debian's prometheus package)"
    return path


def test_rules_pass_promtool():
    for args in (["check", "rules", RULES], ["test", "rules", RULES_TEST]):
        r = subprocess.run([tool("promtool"), *args], capture_output=True, text=True, cwd=os.path.dirname(RULES))
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"
    # Every rule has a unit test that expects it to fire.
    with open(RULES) as f:
        names = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    with open(RULES_TEST) as f:
        tested = {c["alertname"] for t in yaml.safe_load(f)["tests"] for c in t["alert_rule_test"]
                  if c.get("exp_alerts")}
    assert names == tested, names ^ tested


class Prometheus:
    """A Prometheus of the test's own: scrapes one kmirrord every second, loads the rules."""

    def __init__(self, target, tmp):
        self.port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [RULES],
                  "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}]}
        path = os.path.join(tmp, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self.log = open(os.path.join(tmp, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={path}", f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self.ready, 60, 0.2, "Prometheus to be ready")

    def ready(self):
        assert self.proc.poll() is None, "Prometheus exited: see prometheus.log"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", (expr, doc)
        return doc["data"]["result"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def obs(kmirrord_bin, kmirror_bin, dest_cluster, tmp_path_factory):  # noqa: F811
    """A source of the module's own (the test stops it), a kmirrord mirroring one topic from it into
    the suite's destination, and a Prometheus scraping that kmirrord."""
    src = KafkaCluster("obs", brokers=1)
    src.start()
    tmp = str(tmp_path_factory.mktemp("obs"))
    # A state topic of its own: the suite's other mirrors (sources stopped, syncs run elsewhere) are not
    # this kmirrord's to alert on.
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, src, tmp, "kmirrord-obs",
                      mirror_state_topic=f"__mirror_state_obs_{uuid.uuid4().hex[:8]}")
    topic = unique("obs")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 200, partitions=2)
    env.start(topic)
    prom = Prometheus(f"{PROXY_HOST}:{env.proxy.http_port}", tmp)
    try:
        yield env, src, prom, topic
    finally:
        prom.stop()
        try:
            _teardown(env)
        finally:
            src.stop()


def mirror_gauge(env, name):
    return env.proxy.metrics().get(f'{name}{{mirror="{env.mirror}"}}')


def dashboard_exprs(env):
    """(where, expr) of every panel target and template variable query, the variables substituted
    as Grafana would: this kmirrord's instance and mirror, a 30 s rate interval."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    subst = {"$instance": f"{PROXY_HOST}:{env.proxy.http_port}", "$mirror": env.mirror, "$__rate_interval": "30s"}

    def fill(expr):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, f"a variable the test does not know: {expr}"
        return expr

    out = []
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            # label_values(SELECTOR, LABEL): the selector must have series carrying the label.
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"]["query"])
            assert m, v
            out.append((f"variable {v['name']}", f"count by ({m.group(2)}) ({fill(m.group(1))})"))
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for p in panels:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        for t in p["targets"]:
            out.append((f"panel {p['title']!r}", fill(t["expr"])))
    return out


def rule_exprs():
    """(alert, expr) of every rule, its final comparison with a number removed: what it compares
    must exist, whether or not it crosses the threshold now."""
    with open(RULES) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    out = []
    for r in rules:
        expr = re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.]+\s*$", "", r["expr"].strip())
        assert expr != r["expr"].strip(), f"{r['alert']}: no comparison to take off"
        out.append((f"rule {r['alert']}", expr))
    return out


def test_every_panel_and_rule_has_data(obs):
    env, _, prom, topic = obs
    # A metadata sync of the mirror, some scrapes for the rates, then records flowing.
    wait_until(lambda: mirror_gauge(env, "kmirror_mirror_source_reachable") == 1, 60, 0.5, "the source reachable")
    wait_until(lambda: any(v > 0 for k, v in env.proxy.metrics().items()
                           if k.startswith(f'kmirror_mirror_sync_last_success_timestamp_seconds{{mirror="{env.mirror}"')),
               120, 0.5, "a metadata sync of the mirror")
    wait_until(lambda: prom.query(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 5'), 60, 0.5, "five scrapes")
    produce_records(env.sb, topic, 200, start=200, partitions=2)
    wait_until(lambda: prom.query(f'sum(increase(kmirror_mirror_records_total{{mirror="{env.mirror}"}}[30s])) > 0'),
               60, 0.5, "records mirrored, in Prometheus")
    # A name that is not served has no data: what makes the checks below able to fail.
    assert prom.query('kmirror_mirror_lag_ms') == []
    missing = []
    for where, expr in dashboard_exprs(env) + rule_exprs():
        res = prom.query(expr)
        print(f"{where}: {len(res)} series  {expr}")
        if not res:
            missing.append(f"{where}: {expr}")
    assert not missing, "expressions without data:\n" + "\n".join(missing)
    # The rules loaded into Prometheus as they are, and none fires on a healthy mirror.
    with urllib.request.urlopen(f"http://127.0.0.1:{prom.port}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    firing = [(a["labels"], a["state"]) for g in groups for rule in g["rules"] for a in rule.get("alerts", [])]
    assert [r["name"] for g in groups for r in g["rules"]], groups
    assert firing == [], firing


def test_source_stopped_shows_in_metrics_and_healthz(obs):
    env, src, prom, _ = obs
    wait_until(lambda: mirror_gauge(env, "kmirror_mirror_source_reachable") == 1, 60, 0.5, "the source reachable")
    first = mirror_gauge(env, "kmirror_mirror_last_fetch_timestamp_seconds")
    wait_until(lambda: mirror_gauge(env, "kmirror_mirror_last_fetch_timestamp_seconds") > first, 10, 0.2,
               "the last fetch time to advance while the source answers")
    assert abs(first - time.time()) < 30, first
    status, body = env.proxy.http_get("/healthz")
    assert status == 200 and f"\nmirror {env.mirror}: source reachable since " in body, body

    (node,) = src.broker_ids
    src.stop_broker(node)
    try:
        wait_until(lambda: mirror_gauge(env, "kmirror_mirror_source_reachable") == 0, 60, 0.5,
                   "kmirror_mirror_source_reachable to go to 0")
        stopped = mirror_gauge(env, "kmirror_mirror_last_fetch_timestamp_seconds")
        wait_until(lambda: prom.query(f'kmirror_mirror_source_reachable{{mirror="{env.mirror}"}} == 0'), 30, 0.5,
                   "Prometheus to see the source unreachable")
        time.sleep(3)  # fetches would have advanced it several times
        assert mirror_gauge(env, "kmirror_mirror_last_fetch_timestamp_seconds") == stopped
        # kmirrord itself works: /healthz says what is wrong with the source but answers 200.
        status, body = env.proxy.http_get("/healthz")
        print(body)
        assert status == 200 and body.startswith("ok\n"), body
        assert re.search(rf"\nmirror {re.escape(env.mirror)}: source UNREACHABLE since \S+, last fetch \d+ ms ago: \S",
                         body), body
        req = urllib.request.Request(f"http://{PROXY_HOST}:{env.proxy.http_port}/healthz",
                                     headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "application/json"
            doc = json.load(r)
        (m,) = [m for m in doc["mirrors"] if m["mirror"] == env.mirror]
        assert m["source_reachable"] is False and m["error"] and m["last_fetch_ms"] == int(stopped * 1000), doc
        assert doc["status"] == "ok" and doc["state"]["loaded"] and doc["upstream"]["reachable"], doc
        assert env.proxy.http_get("/readyz") == (200, "ok\n")
    finally:
        src.start_broker(node)
    wait_until(lambda: mirror_gauge(env, "kmirror_mirror_source_reachable") == 1, 120, 0.5,
               "the source reachable again")
    wait_until(lambda: mirror_gauge(env, "kmirror_mirror_last_fetch_timestamp_seconds") > stopped, 60, 0.5,
               "fetches again")
