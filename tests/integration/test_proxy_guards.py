"""Writes kmirrord must refuse whatever the mirror's state: config requests that do not decode
(fail closed: a broker ignores trailing bytes, so a request kmirrord cannot read could still
reconfigure the state topic), and internal topics (__*, the state topic) as mirror topics, by
StartMirrorTopics and by mirror.name. Each test sends what a client could send through kmirrord
and checks, on the destination itself, that nothing changed."""

import struct
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from test_mirror_configs import START, Client

pytestmark = [pytest.mark.proxy, main_release_only]

INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED = 17, 29


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topic_configs(cluster, topic):
    """The topic's configs as the destination itself says (not through kmirrord)."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: v.value for k, v in a.describe_configs([res])[res].result(timeout=30).items()}


@pytest.fixture
def guarded(proxy_factory, dest_cluster, source_cluster):
    """A kmirrord with a state topic of its own and one mirror, but no mirrored topic: nothing is
    read-only. Returns (proxy, state topic, mirror)."""
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    mirror = unique("m")
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    c = Client(p.bootstrap)
    try:
        code, msg = c.create(mirror, {"bootstrap.servers": source_cluster.bootstrap})
        assert code == 0, msg  # written to the state topic, which exists from then on
    finally:
        c.close()
    return p, state_topic, mirror


# ---- config requests that do not decode fail closed ------------------------------------------

def iac_v0(topic, name, value, trailing=b""):
    """IncrementalAlterConfigs v0 (the version before flexible ones) of one topic config, SET, with bytes after it."""
    t, n, v = topic.encode(), name.encode(), value.encode()
    resource = (struct.pack(">bh", 2, len(t)) + t + struct.pack(">i", 1) + struct.pack(">h", len(n)) + n +
                struct.pack(">bh", 0, len(v)) + v)
    return struct.pack(">i", 1) + resource + b"\x00" + trailing


def iac_answer(r):
    """(error code, message) of the one resource of an IncrementalAlterConfigs v0 answer."""
    r.i32()  # throttle
    assert r.i32() == 1
    code = r.i16()
    ln = r.i16()
    msg = r.take(ln).decode() if ln >= 0 else None
    return code, msg


@pytest.mark.parametrize("trailing", [b"", b"\x00", b"\x01\x02\x03"])
def test_state_topic_config_fails_closed(guarded, dest_cluster, trailing):
    p, state_topic, mirror = guarded
    assert topic_configs(dest_cluster, state_topic)["cleanup.policy"] == "compact"
    c = Client(p.bootstrap)
    try:
        r = c.call(44, 0, iac_v0(state_topic, "cleanup.policy", "delete", trailing), header=1)
        code, msg = iac_answer(r)
        print("answer:", code, msg)
        assert code != 0
    except ConnectionError:
        pass  # closing the connection is failing closed too
    finally:
        c.close()
    assert topic_configs(dest_cluster, state_topic)["cleanup.policy"] == "compact"


# ---- internal topics are never mirror topics -----------------------------------------------

@pytest.fixture
def internal_topic(dest_cluster):
    """A topic named like an internal one (__*), created on the destination itself."""
    name = f"__kmtest_{uuid.uuid4().hex[:8]}"
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    a.create_topics([NewTopic(name, 1, 1)], operation_timeout=30)[name].result(timeout=60)
    return name


def test_internal_topics_refused_by_start(guarded, internal_topic, dest_cluster):
    p, state_topic, mirror = guarded
    c = Client(p.bootstrap)
    try:
        for topic in (internal_topic, state_topic):
            code, msg, per = c.topics(START, mirror, [topic])
            tcode, tmsg = per[topic]
            print(f"start {topic}:", tcode, tmsg)
            assert tcode == INVALID_TOPIC_EXCEPTION, (topic, tcode, tmsg)
            assert "internal" in tmsg, tmsg
    finally:
        c.close()


def test_internal_topics_refused_by_mirror_name(guarded, internal_topic):
    p, state_topic, mirror = guarded
    a = AdminClient(p.conf())
    for topic, code in ((internal_topic, INVALID_TOPIC_EXCEPTION), (state_topic, TOPIC_AUTHORIZATION_FAILED)):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("mirror.name", mirror, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            a.incremental_alter_configs([res])[res].result(timeout=30)
        print(f"mirror.name on {topic}:", e.value)
        assert e.value.args[0].code() == code, e.value
