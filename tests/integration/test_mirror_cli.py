"""The kmirror CLI end to end: kmirrord in front of real destination clusters (1 and 3 brokers) with
a real source cluster; every command with table and JSON output, per-partition states, state kept
across kmirrord restarts (SIGTERM and kill -9), the documented refusals, and secrets that never
reach __mirror_state's bytes, describe or kmirrord's log."""

import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from confluent_kafka import KafkaError

from mirror_cli import Cli, described, kmirror_bin, topic_states, wait_states  # noqa: F401
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until

STATE_TOPIC = "__mirror_state"


def table(text):
    """Rows of a kmirror table (split on runs of 2+ spaces), header included."""
    import re
    return [re.split(r"\s{2,}", ln.strip()) for ln in text.strip().splitlines() if ln.strip()]


@pytest.fixture(scope="session")
def secret_key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mirror-key") / "mirror.key"
    path.write_text(os.urandom(32).hex() + "\n")
    os.chmod(path, 0o600)
    return str(path)


def mirror_proxy(proxy_factory, cluster, key_file=None, **options):
    if key_file:
        options["mirror_secret_key_file"] = key_file
    return proxy_factory(cluster, **options)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def restart(proxy, kill):
    """Stops kmirrord (SIGTERM, or SIGKILL: no drain, no goodbye) and starts it on the same ports."""
    if kill:
        proxy.signal(signal.SIGKILL)
        proxy.daemon.proc.wait(timeout=30)
    else:
        assert proxy.stop() == 0, proxy.daemon.tail()
    proxy.start()


# ---------------------------------------------------------------------------------------------


def test_cli_usage_and_broker(kmirror_bin, dest_cluster):
    cli = Cli(kmirror_bin, dest_cluster.bootstrap)
    r = subprocess.run([kmirror_bin, "--version"], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0 and r.stdout.startswith("kmirror ")
    for cmd in ("create", "list", "describe", "alter", "delete", "start", "stop", "pause", "resume",
                "last-mirrored-offsets"):
        r = subprocess.run([kmirror_bin, cmd, "--help"], stdout=subprocess.PIPE, text=True)
        assert r.returncode == 0 and f"] {cmd}" in r.stdout.splitlines()[0], r.stdout
    # Usage errors: exit 2 and one line, before any connection.
    for args, why in ((["start", "--mirror", "m"], "--topics or --topics-regex is required"),
                      (["frob"], "unknown command 'frob'"),
                      (["create", "--mirror", "m"], "--source-bootstrap is required"),
                      (["describe", "--bogus"], "unknown option '--bogus'")):
        r = cli.run(*args, expect=2)
        assert r.stderr.count("\n") == 1 and why in r.stderr, r.stderr
    # A Java-only property in --command-config is refused with what to use instead.
    props = os.path.join(dest_cluster.base_dir, "cli-truststore.properties")
    with open(props, "w") as f:
        f.write("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n")
    r = cli.run("--command-config", props, "list", expect=2)
    assert "ssl.truststore.location" in r.stderr and "ssl.ca.location" in r.stderr, r.stderr
    # A broker answers ApiVersions without the mirror RPCs.
    r = cli.run("list", expect=1)
    assert r.stderr.strip() == (f"kmirror: {dest_cluster.bootstrap} does not answer mirror RPCs: point "
                                "--bootstrap-server at kmirrord, not at a Kafka broker"), r.stderr
    # Nobody listening.
    r = cli.run("list", expect=1, bootstrap="127.0.0.1:1")
    assert "cannot connect to 127.0.0.1:1" in r.stderr


def test_mirror_lifecycle(kmirror_bin, cluster, source_cluster, proxy_factory, secret_key_file):
    proxy = mirror_proxy(proxy_factory, cluster, secret_key_file)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("life")
    t1, t2, other = unique("orders"), unique("payments"), unique("plain")
    cluster.create_topic(t1, partitions=3)
    cluster.create_topic(t2, partitions=1)
    cluster.create_topic(other, partitions=1)

    # create, then create again
    r = cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
                "--config", "mirror.fetch.max.bytes=1048576", "--validate-only")
    assert "valid" in r.stdout
    assert mirror not in cli.run("list").stdout  # validate-only created nothing
    r = cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    assert r.stdout.strip() == f"Created mirror {mirror}."
    err, _, doc = cli.refused("CLUSTER_MIRROR_ALREADY_EXISTS", "create", "--mirror", mirror,
                              "--source-bootstrap", source_cluster.bootstrap)
    assert err.startswith("kmirror: create: CLUSTER_MIRROR_ALREADY_EXISTS: ") and mirror in err
    assert doc["error"]["code"] == 32001 and doc["error"]["name"] == "CLUSTER_MIRROR_ALREADY_EXISTS"

    # list: table and JSON
    rows = table(cli.run("list").stdout)
    assert rows[0] == ["MIRROR", "SOURCE", "TOPICS"]
    assert [mirror, source_cluster.bootstrap, "0"] in rows
    doc, _ = cli.json("list")
    assert {"name": mirror, "source_bootstrap_servers": source_cluster.bootstrap, "topic_count": 0} in doc["mirrors"]

    # start: every topic's result; a topic already mirrored is refused, the others still start
    r = cli.run("start", "--mirror", mirror, "--topics", f"{t1},{t2}")
    assert table(r.stdout) == [["TOPIC", "RESULT", "MESSAGE"], [t1, "started", "-"], [t2, "started", "-"]]
    err, out, doc = cli.refused("TOPIC_ALREADY_IN_CLUSTER_MIRROR", "start", "--mirror", mirror,
                                "--topics", f"{t1},{other}", json_too=False)
    rows = table(out)
    assert rows[1][:2] == [t1, "TOPIC_ALREADY_IN_CLUSTER_MIRROR"] and t1 in rows[1][2]
    assert rows[2] == [other, "started", "-"]
    assert err.startswith("kmirror: start: 1 of 2 topics refused; first: TOPIC_ALREADY_IN_CLUSTER_MIRROR: ")

    # describe: per-partition states, table and JSON
    states = wait_states(cli, mirror, {t1: "MIRRORING", t2: "MIRRORING", other: "MIRRORING"})
    assert len(states[t1]) == 3 and len(states[t2]) == 1
    r = cli.run("describe", "--mirror", mirror)
    lines = r.stdout.splitlines()
    assert lines[0] == f"Mirror: {mirror}"
    rows = table(r.stdout)
    assert ["CONFIG", "VALUE"] in rows and ["bootstrap.servers", source_cluster.bootstrap] in rows
    hdr = ["TOPIC", "PARTITION", "STATE", "SINCE", "SOURCE-END", "MIRRORED", "LAG", "SKIPPED", "LAST-ERROR"]
    assert hdr in rows
    prow = rows[rows.index(hdr) + 1:]
    assert sorted((p[0], p[1], p[2]) for p in prow) == sorted(
        [(t1, str(i), "MIRRORING") for i in range(3)] + [(t2, "0", "MIRRORING"), (other, "0", "MIRRORING")])
    assert all(p[3].endswith("Z") for p in prow)  # since: a UTC time
    m = described(cli, mirror)
    t1d = next(t for t in m["topics"] if t["name"] == t1)
    assert [p["partition"] for p in t1d["partitions"]] == [0, 1, 2]
    assert set(t1d["partitions"][0]) == {"partition", "state", "state_change_time_ms", "source_log_end_offset",
                                         "mirrored_offset", "lag", "skipped_records", "last_error",
                                         "last_error_time_ms"}
    assert t1d["partitions"][0]["state_change_time_ms"] > 0
    # --topics narrows describe
    m2, _ = cli.json("describe", "--mirror", mirror, "--topics", t2)
    assert [t["name"] for t in m2["mirrors"][0]["topics"]] == [t2]

    # pause / resume
    r = cli.run("pause", "--mirror", mirror, "--topics", t1)
    assert table(r.stdout)[1][:2] == [t1, "paused"]
    wait_states(cli, mirror, {t1: "PAUSED"})
    err, out, doc = cli.refused("INVALID_CLUSTER_MIRROR_STATES", "pause", "--mirror", mirror, "--topics", t1)
    assert t1 in err and "PAUSED" in err  # names the topic and its state
    assert doc["topics"][0]["error"]["name"] == "INVALID_CLUSTER_MIRROR_STATES"
    err, out, doc = cli.refused("MIRROR_TOPIC_NOT_PAUSED", "resume", "--mirror", mirror, "--topics", t2)
    assert t2 in err
    assert doc == {"mirror": mirror, "operation": "resume",
                   "topics": [{"name": t2, "error": doc["topics"][0]["error"]}]}
    assert doc["topics"][0]["error"]["code"] == 32005
    doc, _ = cli.json("resume", "--mirror", mirror, "--topics", t1)
    assert doc == {"mirror": mirror, "operation": "resume", "topics": [{"name": t1, "error": None}]}
    wait_states(cli, mirror, {t1: "MIRRORING"})

    # stop: a topic not in the mirror; --topics-regex over the mirror's topics
    err, _, doc = cli.refused("TOPIC_NOT_IN_CLUSTER_MIRROR", "stop", "--mirror", mirror, "--topics",
                              unique("nosuch"))
    # alter, last-mirrored-offsets
    r = cli.run("alter", "--mirror", mirror, "--config", "mirror.fetch.max.bytes=2097152")
    assert r.stdout.strip() == f"Altered mirror {mirror}."
    assert {"name": "mirror.fetch.max.bytes", "value": "2097152", "sensitive": False} in described(cli, mirror)["configs"]
    r = cli.run("last-mirrored-offsets", "--mirror", mirror, "--topics", t1)
    rows = table(r.stdout)
    assert rows[0] == ["TOPIC", "PARTITION", "STATE", "LAST-MIRRORED-OFFSET", "LAST-MIRRORED-EPOCH", "ERROR"]
    assert [row[:3] for row in rows[1:]] == [[t1, str(i), "MIRRORING"] for i in range(3)]
    doc, _ = cli.json("last-mirrored-offsets", "--mirror", mirror)
    assert sorted(t["name"] for t in doc["topics"]) == sorted([t1, t2, other])
    assert all(set(p) == {"partition", "state", "last_mirrored_offset", "last_mirrored_epoch"}
               for t in doc["topics"] for p in t["partitions"])

    # delete refused while topics are live; stop them all by regex; delete
    cli.refused("CLUSTER_MIRROR_IN_USE", "delete", "--mirror", mirror)
    doc, _ = cli.json("stop", "--mirror", mirror, "--topics-regex", ".*")
    assert sorted(t["name"] for t in doc["topics"]) == sorted([t1, t2, other])
    assert all(t["error"] is None for t in doc["topics"])
    wait_states(cli, mirror, {t1: "STOPPED", t2: "STOPPED", other: "STOPPED"})
    err, _, _ = cli.refused("INVALID_CLUSTER_MIRROR_STATES", "pause", "--mirror", mirror, "--topics", t2)
    assert t2 in err and "STOPPED" in err
    # a stopped topic may start again (start --topics-regex over the destination's topics)
    doc, _ = cli.json("start", "--mirror", mirror, "--topics-regex", t2.replace("-", "[-]"))
    assert doc["topics"] == [{"name": t2, "error": None}]
    wait_states(cli, mirror, {t2: "MIRRORING"})
    cli.run("stop", "--mirror", mirror, "--topics", t2)
    wait_states(cli, mirror, {t2: "STOPPED"})
    doc, _ = cli.json("delete", "--mirror", mirror)
    assert doc == {"mirror": mirror, "deleted": True}
    assert mirror not in cli.run("list").stdout

    # unknown mirror, for every command that names one
    ghost = unique("ghost")
    for args in (["describe", "--mirror", ghost], ["delete", "--mirror", ghost],
                 ["alter", "--mirror", ghost, "--config", "mirror.fetch.max.bytes=65536"],
                 ["start", "--mirror", ghost, "--topics", t1], ["stop", "--mirror", ghost, "--topics", t1],
                 ["pause", "--mirror", ghost, "--topics", t1], ["resume", "--mirror", ghost, "--topics", t1],
                 ["last-mirrored-offsets", "--mirror", ghost]):
        err, _, _ = cli.refused("UNKNOWN_CLUSTER_MIRROR", *args, json_too=False)
        assert ghost in err, err


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "kill9"])
def test_state_survives_restart(kmirror_bin, dest_cluster, source_cluster, proxy_factory, secret_key_file, kill):
    proxy = mirror_proxy(proxy_factory, dest_cluster, secret_key_file)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("restart")
    t1, t2 = unique("kept"), unique("paused")
    dest_cluster.create_topic(t1, partitions=2)
    dest_cluster.create_topic(t2, partitions=1)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
            "--config", "mirror.replication.throttled.rate=1000000")
    cli.run("start", "--mirror", mirror, "--topics", f"{t1},{t2}")
    wait_states(cli, mirror, {t1: "MIRRORING", t2: "MIRRORING"})
    cli.run("pause", "--mirror", mirror, "--topics", t2)
    wait_states(cli, mirror, {t2: "PAUSED"})
    before = described(cli, mirror)

    restart(proxy, kill)
    after = described(cli, mirror)  # the CLI waits out COORDINATOR_LOAD_IN_PROGRESS
    assert after == before
    assert topic_states(cli, mirror) == {t1: ["MIRRORING", "MIRRORING"], t2: ["PAUSED"]}
    # the restarted daemon still enforces the states it read back
    cli.refused("MIRROR_TOPIC_NOT_PAUSED", "resume", "--mirror", mirror, "--topics", t1, json_too=False)
    cli.refused("TOPIC_ALREADY_IN_CLUSTER_MIRROR", "start", "--mirror", mirror, "--topics", t1, json_too=False)
    cli.run("stop", "--mirror", mirror, "--topics", f"{t1},{t2}")
    wait_states(cli, mirror, {t1: "STOPPED", t2: "STOPPED"})
    cli.run("delete", "--mirror", mirror)


def _state_bytes(cluster):
    """Every byte of every segment of __mirror_state on every broker of the cluster."""
    out = b""
    for n in cluster.broker_nodes:
        for d in os.listdir(n.data_dir):
            if d.rsplit("-", 1)[0] != STATE_TOPIC:
                continue
            for f in os.listdir(os.path.join(n.data_dir, d)):
                if f.endswith(".log"):
                    with open(os.path.join(n.data_dir, d, f), "rb") as fh:
                        out += fh.read()
    return out


def _consume_all(cluster, topic, timeout=30.0):
    """[(key, value)] of every record of topic, read from the cluster's brokers (not through kmirrord)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("raw"),
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])  # offset 0: from the beginning
        left, out = set(parts), []
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
                    continue
                raise AssertionError(f"consuming {topic}: {m.error()}")
            out.append((m.key(), m.value()))
        assert not left, f"{topic}: partitions {sorted(left)} not read to the end"
        return out
    finally:
        c.close()


def test_secrets(kmirror_bin, cluster, source_cluster, proxy_factory, secret_key_file):
    proxy = mirror_proxy(proxy_factory, cluster, secret_key_file)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("secret")
    password = "pw-" + uuid.uuid4().hex
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.sasl_bootstrap,
            "--config", "security.protocol=SASL_PLAINTEXT", "--config", "sasl.mechanism=PLAIN",
            "--config", "sasl.username=admin", "--config", f"sasl.password={password}")

    # describe masks it, table and JSON
    r = cli.run("describe", "--mirror", mirror)
    assert password not in r.stdout and password not in r.stderr
    assert ["sasl.password", "(secret)"] in table(r.stdout)
    doc, r = cli.json("describe", "--mirror", mirror)
    assert password not in r.stdout
    assert {"name": "sasl.password", "value": None, "sensitive": True} in doc["mirrors"][0]["configs"]
    assert {"name": "sasl.username", "value": "admin", "sensitive": False} in doc["mirrors"][0]["configs"]

    # the raw bytes of __mirror_state on disk: the mirror is there, its password is not
    def flushed():
        raw = _state_bytes(cluster)
        return mirror.encode() in raw and raw
    raw = wait_until(flushed, 30, 0.5, what=f"{mirror} in {STATE_TOPIC}'s segments")
    assert password.encode() not in raw
    # and through the broker: every record's key and value, consumed straight from the cluster
    records = _consume_all(cluster, STATE_TOPIC)
    assert any(mirror.encode() in (k or b"") for k, _ in records), f"{mirror} has no record"
    assert not any(password.encode() in (k or b"") + (v or b"") for k, v in records)

    # a restart reads it back and decrypts it (describe still masks it)
    restart(proxy, kill=False)
    doc, _ = cli.json("describe", "--mirror", mirror)
    assert {"name": "sasl.password", "value": None, "sensitive": True} in doc["mirrors"][0]["configs"]
    cli.run("delete", "--mirror", mirror)
    assert password not in proxy.output(), "kmirrord's log holds the password"

    # without a key file the same create is refused
    bare = mirror_proxy(proxy_factory, cluster, None, name="kmirrord-nokey")
    cli2 = Cli(kmirror_bin, bare.bootstrap)
    err, _, doc = cli2.refused("CLUSTER_MIRROR_SECRET_KEY_MISSING", "create", "--mirror", unique("nokey"),
                               "--source-bootstrap", source_cluster.sasl_bootstrap,
                               "--config", "security.protocol=SASL_PLAINTEXT", "--config", "sasl.mechanism=PLAIN",
                               "--config", "sasl.username=admin", "--config", f"sasl.password={password}")
    assert doc["error"]["code"] == 32008
    assert password not in bare.output()
