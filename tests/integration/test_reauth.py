"""Re-authentication (KIP-368) with kmirrord: a source and a destination whose SASL listener ends
every session after a few seconds (`connections.max.reauth.ms`). A broker closes a connection
whose session ended at its next request; a client that authenticates again on the same connection
before then keeps it. kmirrord's own connections (the pipelines' to the source, its metadata,
state and lease connections to the destination) do so themselves, and a client's own
re-authentication passes through kmirrord like its first login (docs/security.md,
"Re-authentication")."""

import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from harness import USERS, KafkaCluster
from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import BackgroundProducer, compare_topic, main_release_only, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import secret_key_and_file_dir, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

REAUTH_MS = 4000
ADMIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "admin", "sasl.password": USERS["admin"]}
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.fixture(scope="module")
def reauth_clusters():
    tag = uuid.uuid4().hex[:6]
    o = {"listener.name.sasl.connections.max.reauth.ms": str(REAUTH_MS)}
    src = KafkaCluster(f"reauth-src-{tag}", brokers=1, overrides=o)
    dst = KafkaCluster(f"reauth-dst-{tag}", brokers=1, overrides=o)
    src.start()
    try:
        dst.start()
        try:
            yield src, dst
        finally:
            dst.stop()
    finally:
        src.stop()


def props(path):
    with open(path, "w") as f:
        f.write("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                f'sasl.jaas.config={SCRAM} required username="admin" password="{USERS["admin"]}";\n')
    return str(path)


def cli(binary, proxy, conf, *args):
    argv = [binary, "--bootstrap-server", proxy.bootstrap, "--timeout-ms", "20000", "--command-config", conf,
            *[str(a) for a in args]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def closed_by_brokers(proxy, mark, cluster):
    """kmirrord's log lines, since mark, of a connection to one of cluster's SASL ports that the
    broker closed: its own ("connection to ... closed by peer") and client sessions' upstreams
    ("upstream ... closed the connection")."""
    ports = [n.sasl_address for n in cluster.broker_nodes]
    return [ln for ln in proxy.output()[mark:].splitlines()
            if any(a in ln for a in ports) and ("closed by peer" in ln or "closed the connection" in ln)]


def test_mirror_and_clients_through_reauthentications(kmirror_bin, reauth_clusters, proxy_factory,  # noqa: F811
                                                      tmp_path):
    """A mirror runs and clients produce and consume through kmirrord for 24 s, six sessions'
    lifetimes: every connection of kmirrord's authenticates again in time (none is closed by a
    broker), a client's re-authentication through kmirrord keeps its session, and the mirror is
    exact, every record at its source offset."""
    src, dst = reauth_clusters
    key, files = secret_key_and_file_dir(tmp_path)
    p = proxy_factory(dst, name="kmirrord-reauth", upstream=dst.sasl_bootstrap,
                      upstream_sasl_mechanism="SCRAM-SHA-512", upstream_sasl_username="admin",
                      upstream_sasl_password=USERS["admin"], mirror_secret_key_file=str(key),
                      mirror_file_dir=str(files))
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 30, what="kmirrord's SCRAM login")
    tag = uuid.uuid4().hex[:6]
    topic, local, mirror = f"reauth-{tag}", f"reauth-local-{tag}", f"reauth-mirror-{tag}"
    src.create_topic(topic, partitions=2)
    conf = props(tmp_path / "admin.properties")
    cli(kmirror_bin, p, conf, "create", "--mirror", mirror, "--source-bootstrap", src.sasl_bootstrap,
        "--config-file", conf)
    cli(kmirror_bin, p, conf, "start", "--mirror", mirror, "--topics", topic)
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(p.conf(**ADMIN))
    admin.create_topics([NewTopic(local, 1, 1)])[local].result(timeout=60)
    dst.wait_topic(local, 1)

    bg = BackgroundProducer(src.bootstrap, topic, tag="s", rate=300).start()
    mark = len(p.output())
    # A client through kmirrord: produces to a topic of the destination's own, and reads the
    # mirror topic, on connections that live across the sessions' ends.
    acked, read, errors = [], [], []
    stop = threading.Event()

    def produce():
        pr = Producer(p.conf(**ADMIN, **{"linger.ms": 5, "acks": "all"}))
        i = 0
        while not stop.is_set():
            pr.produce(local, f"v{i}".encode(), key=f"k{i}".encode(),
                       on_delivery=lambda e, m: (errors if e else acked).append(e or m.offset()))
            pr.poll(0.02)
            i += 1
        pr.flush(30)

    def consume():
        c = Consumer(p.conf(**ADMIN, **{"group.id": f"reauth-{tag}", "auto.offset.reset": "earliest",
                                        "enable.auto.commit": False}))
        c.assign([TopicPartition(topic, i, 0) for i in range(2)])
        while not stop.is_set():
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                read.append((m.partition(), m.offset()))
            elif m is not None:
                errors.append(m.error())
        c.close()

    threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    try:
        time.sleep(6 * REAUTH_MS / 1000)
    finally:
        stop.set()
        bg.stop()
        for t in threads:
            t.join(60)
    closes = closed_by_brokers(p, mark, dst) + closed_by_brokers(p, mark, src)
    print(f"through kmirrord: {len(acked)} produced, {len(read)} read; {len(closes)} connection(s) closed by a "
          f"broker; errors {errors[:3]}")
    assert not closes, "a broker closed connections whose session ended:\n" + "\n".join(closes[:10])
    assert acked and not errors, errors[:5]
    assert read, "nothing read through kmirrord"

    end = watermarks(src.bootstrap, topic, 2)
    wait_until(lambda: watermarks(p.bootstrap, topic, 2, **ADMIN) == end, 60, what="the mirror caught up")
    total, _ = compare_topic(p.bootstrap, src.bootstrap, topic, 2, marks=end, proxy_conf=ADMIN)
    assert total == sum(h - lo for lo, h in end) and total > 0
    assert len(set(read)) == len(read), "a record was read twice through kmirrord"
    hw = watermarks(p.bootstrap, local, 1, **ADMIN)[0][1]
    assert hw == len(acked) and sorted(acked) == list(range(hw)), "the local topic lost or doubled a record"
