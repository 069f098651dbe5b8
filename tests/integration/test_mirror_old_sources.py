"""Old sources mirror exactly: a source cluster on Kafka 3.9.x (KRaft) and one on 2.8.x (ZooKeeper),
each mirrored by kmirrord into the suite's 4.4.0 destination. Per source and codec (lz4, zstd): a
4-partition topic with records carrying keys, values, headers and explicit timestamps, produced at
the old source by librdkafka and by that release's own Java producer (its perf tool), half before
the mirror starts and half while it runs; then every record read through the proxy is compared with
the source's (offset, key, value, headers, timestamp). kmirrord runs at debug level: its log must
show the versions negotiated with the old broker (the lower of each side's range) and no partition
going FAILED. Sizes: KM_OLD_SOURCE_RECORDS (default 20,000 per topic)."""

import os
import re
import time
import uuid

import pytest

import harness
from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import (compare_topic, create_dest_topic, env_int, produce_records, progress,
                         wait_caught_up, watermarks)
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

PARTS = 4
N = env_int("KM_OLD_SOURCE_RECORDS", 20_000)
JAVA_N = 3_000
STALL = env_int("KM_MIRROR_STALL_S", 60)
API_PRODUCE, API_FETCH, API_METADATA = 0, 1, 3


class OldEnv:
    """One old source, one kmirrord in front of the destination, one mirror from that source."""

    def __init__(self, release, source, dest, proxy, cli, mirror):
        self.release, self.source, self.dest = release, source, dest
        self.proxy, self.cli, self.mirror = proxy, cli, mirror


@pytest.fixture(scope="module", params=["3.9", "2.8"], ids=["kafka39", "kafka28"])
def old_env(request, kmirrord_bin, kmirror_bin, dest_cluster, tmp_path_factory):
    source = request.getfixturevalue(f"source_cluster_{request.param.replace('.', '')}")
    assert source.version[:2] == tuple(int(x) for x in request.param.split(".")), source.version
    assert source.zk_mode == (source.version < (3, 0))
    log_dir = str(tmp_path_factory.mktemp(f"old{request.param}"))
    proxy = Proxy(kmirrord_bin, dest_cluster, log_dir, name=f"kmirrord-old{request.param}",
                  log_level="debug").start()
    wait_until(lambda: proxy.metric("kmirror_upstream_brokers") >= len(dest_cluster.broker_ids),
               30, what="kmirrord to learn the brokers")
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = f"old{request.param.replace('.', '')}-{uuid.uuid4().hex[:6]}"
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source.bootstrap)
    env = OldEnv(request.param, source, dest_cluster, proxy, cli, mirror)
    yield env
    try:
        if proxy.running():
            cli.run("stop", "--mirror", mirror, "--topics-regex", ".*", expect=None)
    finally:
        proxy.stop()
    reports = proxy.sanitizer_reports()
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


def java_produce(source, topic, n, codec):
    """n records from the old release's own Java producer (ProducerPerformance of its jars)."""
    r = source.run_tool("producer-perf-test", "--topic", topic, "--num-records", n,
                        "--record-size", 300, "--throughput", -1, "--producer-props",
                        f"bootstrap.servers={source.bootstrap}", f"compression.type={codec}",
                        "acks=all", "linger.ms=5")
    assert f"{n} records sent" in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_old_source_mirrors_exactly(old_env, codec):
    env = old_env
    src, pb, sb = env.source, env.proxy.bootstrap, env.source.bootstrap
    topic = f"old{env.release.replace('.', '')}-{codec}-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    src.create_topic(topic, partitions=PARTS)
    # Half before the mirror starts (caught up from the earliest offset), half while it runs.
    half = N // 2
    produce_records(sb, topic, half, codec, tag=codec)
    create_dest_topic(env.dest, sb, topic)
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    produce_records(sb, topic, N - half, codec, start=half, tag=codec)
    java_produce(src, topic, JAVA_N, codec)
    produced = time.monotonic()

    # The source's own batches are what the old producers wrote in that codec (so the mirror
    # carried lz4 / zstd payloads of that release, not something else).
    codecs = {b["codec"] for p in range(PARTS) for b in src.segment_batches(topic, p)}
    assert codecs == {codec}, codecs

    def describe():
        m = described(env.cli, env.mirror)
        return [t for t in m["topics"] if t["name"] == topic]
    marks = wait_caught_up(pb, sb, topic, PARTS, timeout=300, stall=STALL, describe=describe)
    caught = time.monotonic()
    assert sum(hi - lo for lo, hi in marks) == N + JAVA_N, marks
    total, counts = compare_topic(pb, sb, topic, PARTS, marks=marks)
    assert total == N + JAVA_N
    assert counts["differ"] == 0 and counts["lost"] == 0 and counts["duplicated"] == 0, counts
    # The low watermarks agree too (the proxy presents the source's offsets from the start).
    assert watermarks(pb, topic, PARTS) == marks
    states = {p["partition"]: p["state"] for t in describe() for p in t["partitions"]}
    assert states == {p: "MIRRORING" for p in range(PARTS)}, states
    progress(f"Kafka {'.'.join(map(str, src.version))} {codec}: {total} records; produced in "
             f"{produced - t0:.1f}s, caught up {caught - produced:.1f}s later, compared in "
             f"{time.monotonic() - caught:.1f}s")
    log = env.proxy.output()
    failed = [ln for ln in log.splitlines() if "FAILED" in ln]
    assert not failed, "kmirrord logged FAILED:\n" + "\n".join(failed[:20])


def test_old_source_versions_negotiated(old_env):
    """The source client spoke the old broker's versions: kmirrord's ApiVersions line for the
    source connection names the lower of the old broker's and the codec's (4.4.0's) maxima."""
    src = old_env.source
    host, port = src.broker_nodes[0].host, src.broker_nodes[0].client_port
    old = harness.api_versions(host, port, version=3)["apis"]
    dn = old_env.dest.broker_nodes[0]
    new = harness.api_versions(dn.host, dn.client_port)["apis"]
    want = tuple(min(old[k][1], new[k][1]) for k in (API_PRODUCE, API_FETCH, API_METADATA))
    assert want != tuple(new[k][1] for k in (API_PRODUCE, API_FETCH, API_METADATA)), \
        f"Kafka {src.version} offers 4.4.0's maxima: nothing old to negotiate"
    rx = re.compile(r"ApiVersions v(\d+), Produce v(\d+), Fetch v(\d+), Metadata v(\d+)")
    # The mirror's source connection was opened by the tests above (or is opened now by a start).
    got = wait_until(lambda: {tuple(int(x) for x in m.groups()[1:])
                              for m in rx.finditer(old_env.proxy.output())} or None, 30,
                     what="ApiVersions lines in kmirrord's debug log")
    assert want in got, (f"Kafka {src.version}: no connection negotiated Produce/Fetch/Metadata "
                         f"v{want}; kmirrord's connections: {sorted(got)}")
