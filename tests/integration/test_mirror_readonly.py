"""Read-only mirror topics through kmirrord: a mirror topic (started with the kmirror CLI) refuses
writes from stock clients (Java and librdkafka; plain, idempotent, transactional) at once and with
the read-only message, while the same producer's writes to another topic in the same requests
succeed; DeleteRecords, DeleteTopics and CreatePartitions on it are refused."""

import os
import shutil
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from harness.kafka_cluster import java_bin
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import create_topic, produce

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")
READ_ONLY_TOPIC = 32000

pytestmark = pytest.mark.proxy


def kmirror_cli():
    build = os.environ.get("KM_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    path = os.path.join(build, "kmirror")
    if not os.access(path, os.X_OK):
        pytest.skip("kmirror CLI not built")
    return path


def cli(proxy, *args):
    r = subprocess.run([kmirror_cli(), "--bootstrap-server", proxy.bootstrap] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, f"kmirror {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture
def mirrored(proxy_factory, dest_cluster, source_cluster, topic_name):
    """A proxy and two topics on the destination: `ro`, started in mirror m, and `ok`, not mirrored."""
    ro, ok = f"{topic_name}-ro", f"{topic_name}-ok"
    proxy = proxy_factory(dest_cluster)
    create_topic(proxy, ro, partitions=2, rf=1)
    create_topic(proxy, ok, partitions=2, rf=1)
    cli(proxy, "create", "--mirror", "m", "--source-bootstrap", source_cluster.bootstrap)
    cli(proxy, "start", "--mirror", "m", "--topics", ro)
    return proxy, ro, ok, source_cluster.bootstrap


def expected_message(ro, source):
    return (f"topic {ro} is mirrored by mirror m from {source} and is read-only; stop its mirroring "
            f"(kmirror stop --mirror m --topics {ro}) to write to it")


@pytest.fixture(scope="module")
def ro_producer_cp(dest_cluster, tmp_path_factory):
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    assert javac, "javac not found"
    out = str(tmp_path_factory.mktemp("ro-java"))
    subprocess.run([javac, "-d", out, "-cp", os.path.join(dest_cluster.libs, "*"),
                    os.path.join(JAVA_DIR, "ReadOnlyProducer.java")], check=True, timeout=120)
    return out


@pytest.mark.parametrize("mode", ["plain", "idem", "txn"])
def test_java_producer_fails_at_once(mirrored, ro_producer_cp, mode):
    proxy, ro, ok, source = mirrored
    r = proxy.cluster.run_tool("ReadOnlyProducer", proxy.bootstrap, mode, ro, ok,
                               classpath=[ro_producer_cp], check=False, timeout=180)
    print(r.stdout)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert lines["MIRROR"].startswith("ERROR "), r.stdout + r.stderr
    assert expected_message(ro, source) in lines["MIRROR"]
    assert int(lines["MS"]) < 5000, "the write to the mirror topic was retried"
    if mode != "txn":
        assert lines["OTHER"].startswith("OK "), r.stdout
    print(f"java {mode}: {lines['MIRROR']} in {lines['MS']} ms; other: {lines['OTHER']}; "
          f"{lines.get('COMMIT', '')}")


@pytest.mark.parametrize("mode", ["plain", "idem", "txn"])
def test_librdkafka_producer_fails_at_once(mirrored, mode):
    proxy, ro, ok, source = mirrored
    conf = {"linger.ms": 1000, "message.timeout.ms": 60000}
    if mode == "plain":
        conf["acks"] = 1
    if mode in ("idem", "txn"):
        conf["enable.idempotence"] = True
    if mode == "txn":
        conf["transactional.id"] = f"ro-rd-{ro}"
    p = Producer(proxy.conf(**conf))
    p.list_topics(ro, timeout=15)
    p.list_topics(ok, timeout=15)
    if mode == "txn":
        p.init_transactions(30)
        p.begin_transaction()
    got = {}

    def cb(err, msg):
        got[msg.topic()] = (err, time.monotonic())

    t0 = time.monotonic()
    p.produce(ro, b"to-mirror", partition=0, on_delivery=cb)
    p.produce(ok, b"to-other", partition=0, on_delivery=cb)
    p.flush(60)
    commit = None
    if mode == "txn":
        try:
            p.commit_transaction(30)
            commit = "ok"
        except KafkaException as e:
            commit = f"{e.args[0].name()} {e.args[0].str()}"
    err, t = got[ro]
    print(f"librdkafka {mode}: code={err.code()} name={err.name()} str={err.str()!r} "
          f"in {int((t - t0) * 1000)} ms; other: {got[ok][0]}; commit: {commit}")
    assert err is not None and err.code() == READ_ONLY_TOPIC
    # librdkafka reports the code only ("Err-32000?"): it does not show a Produce error's message.
    assert t - t0 < 5.0, "the write to the mirror topic was retried"
    if mode != "txn":
        assert got[ok][0] is None


def test_delete_records_topics_partitions_refused(mirrored):
    proxy, ro, ok, _ = mirrored
    produce(proxy, ok, 10)
    a = AdminClient(proxy.conf())
    with pytest.raises(KafkaException) as e:
        a.delete_topics([ro], operation_timeout=30)[ro].result(timeout=60)
    assert e.value.args[0].code() == READ_ONLY_TOPIC
    with pytest.raises(KafkaException) as e:
        a.create_partitions([NewPartitions(ro, 4)])[ro].result(timeout=60)
    assert e.value.args[0].code() == READ_ONLY_TOPIC
    fs = a.delete_records([TopicPartition(ro, 0, 0), TopicPartition(ok, 0, 5)])
    with pytest.raises(KafkaException):
        fs[TopicPartition(ro, 0, 0)].result(timeout=60)
    assert fs[TopicPartition(ok, 0, 5)].result(timeout=60).low_watermark == 5
    assert ro in a.list_topics(timeout=15).topics
