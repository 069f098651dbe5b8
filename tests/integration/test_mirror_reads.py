"""Reads through kmirrord answered as the source answers them (issue 29, item 11): a Fetch below the
mirrored log start is OFFSET_OUT_OF_RANGE, as at the source, whether mirroring began at a batch
boundary or inside a batch, so that consumers apply their reset policy the same way on both."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import main_release_only, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = main_release_only  # the proxy's translation, the same on every release


@pytest.fixture(scope="module")
def renv(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                      str(tmp_path_factory.mktemp("reads")), "kmirrord-reads")
    yield env
    _teardown(env)


def produce_batches(bootstrap, topic, sizes):
    """One flush per entry of sizes: records in batches that end where each entry ends."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000})
    i = 0
    for n in sizes:
        for _ in range(n):
            p.produce(topic, key=f"k-{i}".encode(), value=f"v-{i}".encode(), partition=0)
            i += 1
        assert p.flush(30) == 0


def read_at(bootstrap, topic, offset, seconds=4.0):
    """A consumer with auto.offset.reset=error assigned at offset: ('records', first offsets) or
    ('error', the error's name)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("below"), "enable.auto.commit": False,
                  "auto.offset.reset": "error", "isolation.level": "read_uncommitted"})
    got = []
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return ("error", m.error().name())
            got.append(m.offset())
            if len(got) >= 3:
                break
    finally:
        c.close()
    return ("records", got[:3])


@pytest.mark.parametrize("layout", ["boundary", "inside"])
def test_fetch_below_the_log_start_as_the_source(renv, layout):
    env = renv
    topic = unique(f"below-{layout}")
    env.source_topic(topic, partitions=1)
    # 100 records; the source's log start moved to 50 by DeleteRecords: at a batch boundary (two
    # batches of 50) or inside the one batch of 100.
    produce_batches(env.sb, topic, [50, 50] if layout == "boundary" else [100])
    tp = TopicPartition(topic, 0, 50)
    admin = AdminClient({"bootstrap.servers": env.sb})
    for f in admin.delete_records([tp], request_timeout=30).values():
        f.result(30)
    assert watermarks(env.sb, topic, 1) == [(50, 100)]
    env.start(topic)
    env.caught_up(topic, 1)
    src, via = read_at(env.sb, topic, 10), read_at(env.pb, topic, 10)
    print(f"{layout}: a fetch at 10 from the source: {src}; through kmirrord: {via}")
    assert src == ("error", "_AUTO_OFFSET_RESET"), src  # librdkafka: OFFSET_OUT_OF_RANGE under reset policy "error"
    assert via == src, (via, src)
    # At and past the log start both serve the same records.
    assert read_at(env.sb, topic, 50) == read_at(env.pb, topic, 50) == ("records", [50, 51, 52])
    assert watermarks(env.pb, topic, 1) == [(50, 100)]
