"""A source that is down (issue 29, item 9): kmirrord must not hammer it. Every reconnect backs off
per broker, exponentially with jitter (Kafka's reconnect.backoff.ms / reconnect.backoff.max.ms
defaults, 50 ms to 1 s), repeated failures are logged once with a count, and the mirror recovers
exactly when the source comes back. Before: about 50,000 connection attempts a second, an info
line each (83.5 MB of log in 15 s), and sockets connected to themselves on the broker's port,
which kept the restarted broker from binding it."""
import re
import time

import pytest

from harness import KafkaCluster
from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import compare_topic, produce_records
from proxy_fixtures import *  # noqa: F401,F403
from test_mirror_data import _mirror_env, _teardown, unique

DOWN_S = 20


@pytest.fixture(scope="module")
def outage(kmirrord_bin, kmirror_bin, dest_cluster, tmp_path_factory):
    src = KafkaCluster("outage", brokers=1)
    src.start()
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, src, str(tmp_path_factory.mktemp("outage")),
                      "kmirrord-outage")
    yield env, src
    try:
        _teardown(env)
    finally:
        src.stop()


def test_a_source_that_is_down_is_not_hammered(outage):
    env, src = outage
    topic = unique("down")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 100, tag="a", partitions=2)
    env.start(topic)
    env.caught_up(topic, 2)
    (node,) = [n.node_id for n in src.broker_nodes]
    addr = env.sb.split(",")[0]

    mark = len(env.proxy.output())
    src.stop_broker(node)
    time.sleep(DOWN_S / 2)
    # stop --dry-run with the source gone (issue 29, item 3): says so, and gives kmirrord's last
    # figures with their age, quickly.
    t0 = time.monotonic()
    doc, _ = env.cli.json("stop", "--mirror", env.mirror, "--topics", topic, "--dry-run")
    took = time.monotonic() - t0
    print(f"dry run with the source down: {took:.1f} s, {doc['source_error']}")
    assert doc["source_asked"] is False and addr.split(":")[-1] in doc["source_error"], doc
    (t,) = doc["topics"]
    assert [(p["source_end_offset"], p["source_end_asked"], p["records_at_risk"]) for p in t["partitions"]] == \
        [(50, False, 0)] * 2, t
    assert all(p["last_fetched_age_ms"] >= 1000 * DOWN_S / 2 - 2000 for p in t["partitions"]), t
    assert took < 15, took
    text = env.cli.run("stop", "--mirror", env.mirror, "--topics", topic, "--dry-run").stdout
    assert "The source was not asked" in text and "s ago)" in text, text
    time.sleep(DOWN_S / 2)
    out = env.proxy.output()[mark:]
    lines = out.splitlines()
    attempts = len(re.findall(rf"client to {re.escape(addr)}: idle -> connecting", out))
    loud = [ln for ln in lines if re.search(r" level=(info|warn|error) ", ln)]
    print(f"source down {DOWN_S} s: {attempts} connection attempts to {addr}, {len(lines)} log lines "
          f"({len(out)} bytes, debug level), {len(loud)} at info or above")
    for ln in loud[:30]:
        print("  ", ln[:220])
    # About one attempt a second per client of the source (pipeline, metadata sync, lease), at most.
    assert attempts <= DOWN_S * 8, attempts
    assert len(loud) <= 60, len(loud)
    assert not re.search(r"unexpected correlation id", out)

    src.start_broker(node)
    produce_records(env.sb, topic, 50, start=100, tag="b", partitions=2)
    env.caught_up(topic, 2, timeout=120)
    total, _ = compare_topic(env.pb, env.sb, topic, 2)
    assert total == 150
