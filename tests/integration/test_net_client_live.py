"""The async client (src/net/client.c) against a real broker: runs the cmocka program
tests/unit/test_net_client_live on a single-broker cluster holding ~64 MB in one partition."""

import os
import subprocess
import time

import pytest

from harness import KafkaCluster
from harness.kafka_cluster import USERS

MB = 1000 * 1000


def live_binary():
    kmirrord = os.environ.get("KMIRRORD")
    if not kmirrord:
        from conftest import find_kmirrord
        kmirrord = find_kmirrord()
    if not kmirrord:
        pytest.skip("no build found (set KMIRRORD=<build>/kmirrord)")
    path = os.path.join(os.path.dirname(kmirrord), "tests", "unit", "test_net_client_live")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} not built (make check builds it)")
    return path


@pytest.fixture(scope="module")
def big_cluster():
    # A 64 MB Fetch response needs the broker's fetch.max.bytes (55 MB by default) raised.
    c = KafkaCluster("netlive", brokers=1,
                     overrides={"fetch.max.bytes": str(128 * 1024 * 1024),
                                "message.max.bytes": str(2 * 1024 * 1024)})
    c.start()
    yield c
    c.stop()


def test_net_client_live(big_cluster):
    binary = live_binary()
    src, dst = "net-live-src", "net-live-dst"
    big_cluster.create_topic(src, partitions=1, replication_factor=1)
    big_cluster.create_topic(dst, partitions=1, replication_factor=1)
    # ~64 MB of uncompressed 1 KB records in 256 KB batches into one partition.
    # producer-perf-test takes --bootstrap-server only from Kafka 4.2 on: the address goes in its props.
    big_cluster.run_tool("producer-perf-test", "--topic", src, "--num-records", 64000,
                         "--record-size", 1000, "--throughput", -1, "--producer-props",
                         f"bootstrap.servers={big_cluster.bootstrap}", "acks=1",
                         "compression.type=none", "batch.size=262144", "linger.ms=20",
                         "buffer.memory=67108864", timeout=300)
    env = dict(os.environ, KM_TEST_BOOTSTRAP=big_cluster.bootstrap, KM_TEST_TOPIC=src,
               KM_TEST_TOPIC2=dst, KM_TEST_SASL_BOOTSTRAP=big_cluster.sasl_bootstrap,
               KM_TEST_SASL_USER="admin", KM_TEST_SASL_PASSWORD=USERS["admin"])
    t0 = time.monotonic()
    r = subprocess.run([binary], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    print(r.stdout)
    print(f"test_net_client_live took {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout[-4000:]
    assert "[  PASSED  ] 2 test(s)." in r.stdout
    assert "SKIPPED" not in r.stdout
    # What it measured, as a user would read it.
    assert "# fetch:" in r.stdout and "# negotiated:" in r.stdout
    assert r.stdout.count("password: NONE") == 3 and r.stdout.count("password: KM_ERR_SASL") == 3
