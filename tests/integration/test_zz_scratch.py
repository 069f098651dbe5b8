import time, uuid
from confluent_kafka import Producer, Consumer, TopicPartition
from proxy_fixtures import *  # noqa
from mirror_cli import Cli, kmirror_bin  # noqa

def read_all(bootstrap, topic, parts):
    out = {}
    for p in range(parts):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "x" + uuid.uuid4().hex, "enable.auto.commit": False})
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        c.assign([TopicPartition(topic, p, lo)])
        recs = []
        while len(recs) < hi - lo:
            m = c.poll(5)
            if m is None:
                break
            if m.error():
                continue
            recs.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()))
        c.close()
        out[p] = (lo, hi, recs)
    return out

def test_scratch(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    t = "s-" + uuid.uuid4().hex[:6]
    source_cluster.create_topic(t, partitions=2)
    dest_cluster.create_topic(t, partitions=2)
    p = Producer({"bootstrap.servers": source_cluster.bootstrap, "compression.type": "lz4", "linger.ms": 5})
    for i in range(5000):
        p.produce(t, key=b"k%d" % i, value=b"v" * (i % 100), headers=[("h", b"x%d" % i)], partition=i % 2)
    p.flush(30)
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    p.produce(t, key=b"ctl", value=b"x", partition=0)
    p.flush(10)
    # something already on the destination: hidden by the map
    pd = Producer({"bootstrap.servers": dest_cluster.bootstrap})
    for i in range(7):
        pd.produce(t, value=b"local", partition=0)
    pd.flush(10)
    cli.run("create", "--mirror", "m1", "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", "m1", "--topics", t)
    s0 = {i: read_all(source_cluster.bootstrap, t, 2)[i][1] for i in range(2)}
    deadline = time.time() + 60
    while time.time() < deadline:
        d = read_all(proxy.bootstrap, t, 2)
        if all(d[i][1] == s0[i] for i in range(2)):
            break
        time.sleep(1)
    print(cli.run("describe", "--mirror", "m1").stdout)
    s = read_all(source_cluster.bootstrap, t, 2)
    d = read_all(proxy.bootstrap, t, 2)
    print(proxy.daemon.tail() if hasattr(proxy, "daemon") else "")
    for i in range(2):
        assert s[i][2] == d[i][2], (i, len(s[i][2]), len(d[i][2]))
