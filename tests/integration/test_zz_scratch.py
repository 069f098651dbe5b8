import time, uuid
from confluent_kafka import Producer, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from proxy_fixtures import *  # noqa
from mirror_cli import Cli, kmirror_bin  # noqa

def wm(b, t):
    c = Consumer({"bootstrap.servers": b, "group.id": "x"})
    r = c.get_watermark_offsets(TopicPartition(t, 0), timeout=10)
    c.close()
    return r

def test_scratch(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    t = "s-" + uuid.uuid4().hex[:6]
    source_cluster.create_topic(t, partitions=1)
    p = Producer({"bootstrap.servers": source_cluster.bootstrap, "linger.ms": 1, "batch.num.messages": 50})
    for i in range(2000):
        p.produce(t, key=b"k%d" % i, value=b"v", partition=0)
        if i % 100 == 0:
            p.flush()
    p.flush(30)
    a = AdminClient({"bootstrap.servers": source_cluster.bootstrap})
    for f in a.delete_records([TopicPartition(t, 0, 333)], operation_timeout=30).values():
        f.result()
    proxy = proxy_factory(dest_cluster, log_level="debug")
    cli = Cli(kmirror_bin, proxy.bootstrap)
    cli.run("create", "--mirror", "m1", "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", "m1", "--topics", t)
    time.sleep(8)
    print("source", wm(source_cluster.bootstrap, t), "dest", wm(dest_cluster.bootstrap, t), "proxy", wm(proxy.bootstrap, t))
    print(proxy.daemon.tail())
    assert False
