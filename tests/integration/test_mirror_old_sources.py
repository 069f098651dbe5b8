"""Old sources mirror exactly: a source cluster on Kafka 3.9.x (KRaft) and one on 2.8.x (ZooKeeper),
each mirrored by kmirrord into the suite's 4.4.0 destination. Per source and codec (lz4, zstd): a
4-partition topic with records carrying keys, values, headers and explicit timestamps, produced at
the old source by librdkafka and by that release's own Java producer (its perf tool), half before
the mirror starts and half while it runs; then every record read through the proxy is compared with
the source's (offset, key, value, headers, timestamp). kmirrord runs at debug level: its log must
show the versions negotiated with the old broker (the lower of each side's range) and no partition
going FAILED. test_old_source_start_creates_topic leaves the destination topic to `kmirror start`
(Metadata and DescribeConfigs at the old source). Sizes: KM_OLD_SOURCE_RECORDS (default 20,000 per
topic)."""

import collections
import os
import re
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

import harness
from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import (assert_segments_exact, compare_topic, create_dest_topic, env_int,
                         offsets_for_times, produce_records, progress, wait_caught_up, watermarks)
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

# The destination is the suite's own release; scripts/test runs the suite again on an older one
# (KM_KAFKA_VERSION), where these tests are skipped to keep CI time (KM_OLD_SOURCES_ALWAYS=1 runs
# them there too).
_POM = os.path.join(harness.kafka_cluster.REPO, "tests", "kafka", "pom.xml")
with open(_POM) as _f:
    POM_RELEASE = re.search(r"<kafka.version>(.*)</kafka.version>", _f.read()).group(1)
if (os.environ.get("KM_KAFKA_VERSION", POM_RELEASE) != POM_RELEASE and
        os.environ.get("KM_OLD_SOURCES_ALWAYS") != "1"):
    pytestmark = [pytest.mark.proxy, pytest.mark.skip(
        reason=f"old sources run against the {POM_RELEASE} destination only")]

PARTS = 4
N = env_int("KM_OLD_SOURCE_RECORDS", 20_000)
JAVA_N = 3_000
STALL = env_int("KM_MIRROR_STALL_S", 60)
API_PRODUCE, API_FETCH, API_METADATA, API_VERSIONS = 0, 1, 3, 18


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
            # The destination is shared: later kmirrords should not load a mirror whose source
            # is gone.
            cli.run("delete", "--mirror", mirror, expect=None)
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
    stamps = [0, int(time.time() * 1000) - 3_600_000 + 500]
    src.create_topic(topic, partitions=PARTS)
    # Half before the mirror starts (caught up from the earliest offset), half while it runs.
    half = N // 2
    produce_records(sb, topic, half, codec, tag=codec)
    stamps.append(int(time.time() * 1000))
    create_dest_topic(env.dest, sb, topic)
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    produce_records(sb, topic, N - half, codec, start=half, tag=codec)
    java_produce(src, topic, JAVA_N, codec)
    produced = time.monotonic()
    stamps += [int(time.time() * 1000) - 2000, int(time.time() * 1000) + 3_600_000]

    # The source's own batches are what the old producers wrote in that codec (so the mirror
    # carries lz4 / zstd payloads of that release): most records, by count; librdkafka sends a
    # batch that compression would not shrink (a record or two) uncompressed.
    by_codec = collections.Counter()
    for p in range(PARTS):
        for b in src.segment_batches(topic, p):
            by_codec[b["codec"]] += b["records"]
    assert set(by_codec) <= {codec, "none"} and by_codec[codec] > 0.9 * (N + JAVA_N), by_codec

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
    # ListOffsets by timestamp (the old broker's time index) answers the same through the proxy.
    by_time_src = offsets_for_times(sb, topic, PARTS, stamps)
    assert by_time_src[0] == [lo for lo, _ in marks] and by_time_src[stamps[-1]] == [-1] * PARTS
    assert offsets_for_times(pb, topic, PARTS, stamps) == by_time_src
    # On disk: every destination batch carries the old producers' compressed records section
    # byte for byte (count, lastOffsetDelta, codec, timestamps too).
    assert_segments_exact(src, env.dest, topic, PARTS)
    states = {p["partition"]: p["state"] for t in describe() for p in t["partitions"]}
    assert states == {p: "MIRRORING" for p in range(PARTS)}, states
    progress(f"Kafka {'.'.join(map(str, src.version))} {codec}: {total} records; produced in "
             f"{produced - t0:.1f}s, caught up {caught - produced:.1f}s later, compared in "
             f"{time.monotonic() - caught:.1f}s")
    log = env.proxy.output()
    failed = [ln for ln in log.splitlines() if "FAILED" in ln]
    assert not failed, "kmirrord logged FAILED:\n" + "\n".join(failed[:20])


def dest_configs(cluster, topic):
    """{name: (value, ConfigSource number)} of a topic as the destination describes it."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(timeout=30)
    return {n: (e.value, int(getattr(e.source, "value", e.source))) for n, e in entries.items()}


DYNAMIC_TOPIC_CONFIG = 1


def test_old_source_start_creates_topic(old_env):
    """`kmirror start` creates the destination topic from the old source's Metadata and
    DescribeConfigs (the versions that release offers): its partitions, the configs set on the
    topic there, minus those 4.4.0 refuses or that are the destination's own; then it mirrors."""
    env = old_env
    src, pb, sb = env.source, env.proxy.bootstrap, env.source.bootstrap
    topic = f"old{env.release.replace('.', '')}-created-{uuid.uuid4().hex[:6]}"
    config = {"retention.ms": "7200000", "max.message.bytes": "2097152",
              "cleanup.policy": "delete", "compression.type": "zstd",
              # Known to the old releases, gone in 4.x (a 4.4.0 destination refuses them).
              "message.format.version": "2.8", "message.downconversion.enable": "false"}
    src.create_topic(topic, partitions=PARTS, config=config)
    produce_records(sb, topic, 4000, "zstd", tag="created")
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    cfg = dest_configs(env.dest, topic)
    for name in ("retention.ms", "max.message.bytes", "cleanup.policy"):
        assert cfg[name] == (config[name], DYNAMIC_TOPIC_CONFIG), (name, cfg[name])
    assert cfg["compression.type"][0] == "producer", cfg["compression.type"]
    assert "message.format.version" not in cfg and "message.downconversion.enable" not in cfg
    marks = wait_caught_up(pb, sb, topic, PARTS, timeout=120, stall=STALL)
    total, counts = compare_topic(pb, sb, topic, PARTS, marks=marks)
    assert total == 4000 and counts["differ"] == 0, counts
    assert_segments_exact(src, env.dest, topic, PARTS)
    failed = [ln for ln in env.proxy.output().splitlines() if "FAILED" in ln]
    assert not failed, "kmirrord logged FAILED:\n" + "\n".join(failed[:20])


def test_old_source_versions_negotiated(old_env):
    """The mirror's connection to the old broker spoke its versions: kmirrord's debug line for that
    connection (host:port of the source) names the lower of the old broker's and the codec's
    (4.4.0's) maxima of ApiVersions, Produce, Fetch and Metadata (ApiVersions v5 refused by the
    old broker, then retried lower)."""
    src = old_env.source
    host, port = src.broker_nodes[0].host, src.broker_nodes[0].client_port
    old = harness.api_versions(host, port, version=3)["apis"]
    dn = old_env.dest.broker_nodes[0]
    new = harness.api_versions(dn.host, dn.client_port)["apis"]
    keys = (API_VERSIONS, API_PRODUCE, API_FETCH, API_METADATA)
    want = tuple(min(old[k][1], new[k][1]) for k in keys)
    assert want != tuple(new[k][1] for k in keys), \
        f"Kafka {src.version} offers 4.4.0's maxima: nothing old to negotiate"
    rx = re.compile(re.escape(f"{host}:{port}") +
                    r": ApiVersions v(\d+), Produce v(\d+), Fetch v(\d+), Metadata v(\d+)")
    # The mirror's source connections were opened by the tests above.
    got = wait_until(lambda: {tuple(int(x) for x in m.groups())
                              for m in rx.finditer(old_env.proxy.output())} or None, 30,
                     what=f"ApiVersions lines for {host}:{port} in kmirrord's debug log")
    progress(f"Kafka {'.'.join(map(str, src.version))}: offers ApiVersions/Produce/Fetch/Metadata "
             f"up to v{tuple(old[k][1] for k in keys)}; kmirrord's connections to it negotiated "
             f"{sorted(got)}")
    assert got == {want}, (f"Kafka {src.version}: connections to {host}:{port} negotiated "
                           f"{sorted(got)}, not {want}")
