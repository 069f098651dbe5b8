"""Read-only mirror topics through kmirrord, on the 1-broker and the 3-broker destination: a mirror
topic (started with the kmirror CLI, each test in a mirror of its own) refuses writes from stock
clients (Java and librdkafka; plain, acks=0, idempotent, transactional) at once and with the
read-only message, while the same producer's writes to another topic succeed (in the same Produce
request for the Java producer); DeleteRecords, DeleteTopics and CreatePartitions on it are refused;
every refusal is logged by kmirrord; after `kmirror stop` the topic is writable again."""

import ctypes
import glob
import os
import re
import shutil
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from harness.kafka_cluster import java_bin
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import create_topic, produce, wait_until

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")
POLICY_VIOLATION = 44  # the default read_only_error
READ_ONLY_TOPIC = 32000  # kmirror's own (read_only_error = kmirror)

pytestmark = pytest.mark.proxy


def kmirror_cli():
    build = os.environ.get("KM_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    path = os.path.join(build, "kmirror")
    if not os.access(path, os.X_OK):
        pytest.skip("kmirror CLI not built")
    return path


def cli(proxy, *args, check=True):
    r = subprocess.run([kmirror_cli(), "--bootstrap-server", proxy.bootstrap] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if check:
        assert r.returncode == 0, f"kmirror {' '.join(args)}: {r.stdout}{r.stderr}"
    return r


class Mirrored:
    """A proxy in front of the destination and two topics on it: `ro`, started in a mirror of
    this test's own, and `ok`, not mirrored."""

    def __init__(self, proxy, ro, ok, mirror, source):
        self.proxy, self.ro, self.ok, self.mirror, self.source = proxy, ro, ok, mirror, source

    def message(self):
        return (f"topic {self.ro} is a read-only mirror of topic {self.ro} on the Kafka cluster at "
                f"{self.source} (mirror {self.mirror}): write to that cluster; this topic takes writes "
                f"only after a failover to this cluster")

    def stop(self):
        cli(self.proxy, "stop", "--mirror", self.mirror, "--topics", self.ro)

    def refusal_logged(self, api, extra=""):
        """kmirrord's line for a refusal of api on ro (the message included); returns it."""
        m = self.proxy.wait_log(rf"refused {api} v(\d+) \(client id \"[^\"]*\"\) on topic[^:]*: "
                                rf"POLICY_VIOLATION: topic {re.escape(self.ro)} [^\n]*{extra}",
                                timeout=10)
        return m.group(0)


@pytest.fixture
def mirrored(proxy_factory, cluster, source_cluster, topic_name):
    ro, ok = f"{topic_name}-ro", f"{topic_name}-ok"
    # Mirrors persist in __mirror_state on the shared destination: each test makes its own.
    mirror = f"m-{uuid.uuid4().hex[:8]}"
    proxy = proxy_factory(cluster)
    create_topic(proxy, ro, partitions=2, rf=1)
    create_topic(proxy, ok, partitions=2, rf=1)
    cli(proxy, "create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli(proxy, "start", "--mirror", mirror, "--topics", ro)
    yield Mirrored(proxy, ro, ok, mirror, source_cluster.bootstrap)
    cli(proxy, "stop", "--mirror", mirror, "--topics", ro, check=False)  # already stopped: refused
    # A stop settles once the partition's pipeline has drained (and reconciled, if it was).
    wait_until(lambda: cli(proxy, "delete", "--mirror", mirror, check=False).returncode == 0, 30,
               what=f"mirror {mirror} deleted after its stop")


def watermarks(proxy, topic, partition=0):
    c = Consumer(proxy.conf(**{"group.id": f"wm-{uuid.uuid4().hex[:6]}"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)
    finally:
        c.close()


@pytest.fixture(scope="module")
def ro_producer_cp(dest_cluster, tmp_path_factory):
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    assert javac, "javac not found"
    out = str(tmp_path_factory.mktemp("ro-java"))
    subprocess.run([javac, "-d", out, "-cp", os.path.join(dest_cluster.libs, "*"),
                    os.path.join(JAVA_DIR, "ReadOnlyProducer.java")], check=True, timeout=120)
    return out


def java_produce(mr, cp, mode):
    r = mr.proxy.cluster.run_tool("ReadOnlyProducer", mr.proxy.bootstrap, mode, mr.ro, mr.ok,
                                  classpath=[cp], check=False, timeout=180)
    print(r.stdout)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert "MIRROR" in lines, r.stdout + r.stderr[-3000:]
    return lines


@pytest.mark.parametrize("mode", ["plain", "idem", "txn"])
def test_java_producer_fails_at_once(mirrored, ro_producer_cp, mode):
    mr = mirrored
    lines = java_produce(mr, ro_producer_cp, mode)
    assert lines["MIRROR"].startswith("ERROR org.apache.kafka.common.errors.PolicyViolationException: "), lines
    assert mr.message() in lines["MIRROR"]
    assert int(lines["MS"]) < 5000, "the write to the mirror topic was retried"
    if mode != "txn":
        # Both records were in one Produce request (linger.ms 1000): the other half went through.
        assert lines["OTHER"].startswith("OK "), lines
    else:
        # The failed send makes the transaction abortable: the commit fails, with the cause.
        assert lines["COMMIT"].startswith("ERROR "), lines
    line = mr.refusal_logged("Produce")
    # The Java 4.4 producer names topics by id against a 4.4 broker: Produce v13.
    assert "refused Produce v13 " in line and "on topic id " in line, line
    print(f"java {mode}: {lines['MIRROR']} in {lines['MS']} ms; other: {lines['OTHER']}; "
          f"{lines.get('COMMIT', '')}\nkmirrord: {line}")


def test_java_acks0_drops_refused_partition(mirrored, ro_producer_cp):
    mr = mirrored
    lines = java_produce(mr, ro_producer_cp, "acks0")
    # acks=0: no answer is due, so the producer sees success for both; nothing lands in ro.
    assert lines["OTHER"].startswith("OK "), lines
    line = mr.refusal_logged("Produce", "acks=0")
    assert watermarks(mr.proxy, mr.ok) == (0, 1)
    assert watermarks(mr.proxy, mr.ro) == (0, 0)
    print(f"java acks=0: mirror {lines['MIRROR']}; other {lines['OTHER']}\nkmirrord: {line}")


def librdkafka_conf(mr, mode):
    conf = {"linger.ms": 1000, "message.timeout.ms": 60000}
    if mode in ("plain", "acks0"):
        conf["acks"] = 1 if mode == "plain" else 0
    if mode in ("idem", "txn"):
        conf["enable.idempotence"] = True
    if mode == "txn":
        conf["transactional.id"] = f"ro-rd-{mr.ro}"
    return mr.proxy.conf(**conf)


@pytest.mark.parametrize("mode", ["plain", "idem", "txn"])
def test_librdkafka_producer_fails_at_once(mirrored, mode):
    mr = mirrored
    p = Producer(librdkafka_conf(mr, mode))
    p.list_topics(mr.ro, timeout=15)
    p.list_topics(mr.ok, timeout=15)
    if mode == "txn":
        p.init_transactions(30)
        p.begin_transaction()
    got = {}

    def cb(err, msg):
        got[msg.topic()] = (err, time.monotonic())

    t0 = time.monotonic()
    # librdkafka sends one partition per Produce request (its response parser takes exactly one
    # topic and partition), so "the same request" is the same producer and connection here.
    p.produce(mr.ro, b"to-mirror", partition=0, on_delivery=cb)
    p.produce(mr.ok, b"to-other", partition=0, on_delivery=cb)
    p.flush(60)
    commit = None
    if mode == "txn":
        try:
            p.commit_transaction(30)
            commit = "ok"
        except KafkaException as e:
            commit = f"{e.args[0].name()} {e.args[0].str()}"
    err, t = got[mr.ro]
    if mode == "txn":
        # Refused before any Produce: AddPartitionsToTxn (else the abort's marker would land in it).
        line = mr.proxy.wait_log(rf"refused AddPartitionsToTxn v\d+ [^\n]*: TOPIC_AUTHORIZATION_FAILED: topic "
                                 rf"{re.escape(mr.ro)} [^\n]*", 10).group(0)
    else:
        line = mr.refusal_logged("Produce")
    print(f"librdkafka {mode}: code={err.code()} name={err.name()} str={err.str()!r} "
          f"in {int((t - t0) * 1000)} ms; other: {got[mr.ok][0]}; commit: {commit}\nkmirrord: {line}")
    assert err is not None
    if mode != "txn":
        assert err.code() == POLICY_VIOLATION and err.str() == "Broker: Policy violation", err
    # confluent-kafka builds a delivery report's KafkaError from the code alone (the message does
    # not reach it: see the C API test below), so the code must be one librdkafka names.
    assert t - t0 < 5.0, "the write to the mirror topic was retried"
    if mode != "txn":
        assert got[mr.ok][0] is None
    else:
        assert commit != "ok"


@pytest.mark.parametrize("mode", ["plain", "idem"])
def test_kafka_python_producer_fails_at_once(mirrored, mode):
    """kafka-python (pure Python): the named error, at once, with kmirrord's message if it shows one."""
    from kafka import KafkaProducer
    from kafka.errors import PolicyViolationError
    mr = mirrored
    conf = {"acks": 1} if mode == "plain" else {"enable_idempotence": True, "acks": "all"}
    p = KafkaProducer(bootstrap_servers=mr.proxy.bootstrap, retries=5, request_timeout_ms=30000, **conf)
    try:
        t0 = time.monotonic()
        with pytest.raises(PolicyViolationError) as e:
            p.send(mr.ro, b"to-mirror", partition=0).get(timeout=60)
        elapsed = time.monotonic() - t0
        try:
            other = f"OK offset {p.send(mr.ok, b'to-other', partition=0).get(timeout=60).offset}"
        except Exception as e2:  # the idempotent producer keeps the error for its later sends
            other = f"ERROR {e2!r}"
    finally:
        p.close(timeout=10)
    print(f"kafka-python {mode}: {e.value!r} in {int(elapsed * 1000)} ms; other: {other}")
    assert mr.message() in str(e.value)
    assert other.startswith("OK") or mode == "idem", other
    assert elapsed < 5.0, "the write to the mirror topic was retried"
    mr.refusal_logged("Produce")


def test_read_only_error_option(mirrored):
    """read_only_error picks the code (reloadable): kmirror's own 32000 and TOPIC_AUTHORIZATION_FAILED."""
    import signal
    mr = mirrored
    for i, (value, code) in enumerate((("kmirror", READ_ONLY_TOPIC), ("topic_authorization_failed", 29))):
        mr.proxy.options["read_only_error"] = value
        mr.proxy.write_config()
        mr.proxy.signal(signal.SIGHUP)
        wait_until(lambda: mr.proxy.metric('kmirror_config_reloads_total{result="ok"}') == i + 1, 15, what="reload")
        got = []
        p = Producer(mr.proxy.conf(**{"message.timeout.ms": 30000}))
        p.produce(mr.ro, b"to-mirror", partition=0, on_delivery=lambda e, m: got.append(e))
        p.flush(30)
        print(f"read_only_error={value}: {got}")
        assert got and got[0] is not None and got[0].code() == code, got


def test_librdkafka_acks0_drops_refused_partition(mirrored):
    mr = mirrored
    p = Producer(librdkafka_conf(mr, "acks0"))
    errs = []
    p.produce(mr.ro, b"to-mirror", partition=0, on_delivery=lambda e, m: errs.append(e))
    p.produce(mr.ok, b"to-other", partition=0, on_delivery=lambda e, m: errs.append(e))
    assert p.flush(30) == 0
    assert errs == [None, None]  # acks=0: nothing comes back, both look delivered
    mr.refusal_logged("Produce", "acks=0")
    # acks=0: flush returns once sent; the broker may append a moment later (seen on 3 brokers).
    wait_until(lambda: watermarks(mr.proxy, mr.ok) == (0, 1), 15, 0.2, what="the record to the other topic")
    assert watermarks(mr.proxy, mr.ro) == (0, 0)


class RdkMessage(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("rkt", ctypes.c_void_p), ("payload", ctypes.c_void_p),
                ("len", ctypes.c_size_t), ("key", ctypes.c_void_p), ("key_len", ctypes.c_size_t),
                ("offset", ctypes.c_int64), ("_private", ctypes.c_void_p)]


def librdkafka_lib():
    import confluent_kafka
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)),
                                  "confluent_kafka.libs", "librdkafka*.so*"))
    lib = ctypes.CDLL(libs[0] if libs else "librdkafka.so.1")
    if not hasattr(lib, "rd_kafka_message_produce_errstr"):
        pytest.skip("librdkafka older than 2.10 (no rd_kafka_message_produce_errstr)")
    return lib


@pytest.mark.parametrize("mode", ["plain", "idem"])
def test_librdkafka_c_api_gets_message(mirrored, mode):
    """librdkafka's C API (the library confluent-kafka loads) parses the ProduceResponse
    partition's ErrorMessage (v8+) and hands it to rd_kafka_message_produce_errstr() (2.10+):
    non-NULL here only because kmirrord sends the message. The string itself is not read: in
    librdkafka 2.10 up to its master (4c3b017) the message's pointer is to the parsed response's
    copy, freed before the delivery report is served (rd_kafka_handle_Produce destroys the result;
    the DR op holds a copy nobody points to), so reading it is a use-after-free."""
    mr = mirrored
    lib = librdkafka_lib()
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_topic_new.restype = vp
    lib.rd_kafka_topic_new.argtypes = [vp, cp, vp]
    lib.rd_kafka_produce.argtypes = [vp, ctypes.c_int32, ctypes.c_int, cp, ctypes.c_size_t, vp,
                                     ctypes.c_size_t, vp]
    lib.rd_kafka_flush.argtypes = [vp, ctypes.c_int]
    lib.rd_kafka_message_produce_errstr.restype = vp
    lib.rd_kafka_message_produce_errstr.argtypes = [ctypes.POINTER(RdkMessage)]
    lib.rd_kafka_err2str.restype = cp
    lib.rd_kafka_topic_destroy.argtypes = [vp]
    lib.rd_kafka_destroy.argtypes = [vp]
    lib.rd_kafka_conf_set_dr_msg_cb.argtypes = [vp, vp]
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    settings = {"bootstrap.servers": mr.proxy.bootstrap, "linger.ms": "100"}
    settings.update({"acks": "1"} if mode == "plain" else {"enable.idempotence": "true"})
    for k, v in settings.items():
        assert lib.rd_kafka_conf_set(conf, k.encode(), v.encode(), errstr, 512) == 0, errstr.value
    got = []

    @ctypes.CFUNCTYPE(None, vp, ctypes.POINTER(RdkMessage), vp)
    def dr(rk, msg, opaque):
        m = msg.contents
        got.append((m.err, lib.rd_kafka_err2str(m.err).decode(),
                    lib.rd_kafka_message_produce_errstr(msg)))

    lib.rd_kafka_conf_set_dr_msg_cb(conf, ctypes.cast(dr, vp))
    rk = lib.rd_kafka_new(0, conf, errstr, 512)
    assert rk, errstr.value
    rkt = lib.rd_kafka_topic_new(rk, mr.ro.encode(), None)
    t0 = time.monotonic()
    assert lib.rd_kafka_produce(rkt, 0, 2, b"to-mirror", 9, None, 0, None) == 0
    lib.rd_kafka_flush(rk, 30000)
    elapsed = time.monotonic() - t0
    lib.rd_kafka_topic_destroy(rkt)
    lib.rd_kafka_destroy(rk)
    print(f"librdkafka C {mode}: {got} in {int(elapsed * 1000)} ms")
    assert len(got) == 1
    err, err2str, produce_errstr = got[0]
    assert err == POLICY_VIOLATION and err2str == "Broker: Policy violation"
    assert produce_errstr, "librdkafka got no ErrorMessage"
    assert elapsed < 5.0


def test_client_id_escaped_in_log(mirrored):
    """A client id is the client's to choose, newlines and quotes included: the refusal's log line
    shows it escaped, and what the client wrote never starts a line of kmirrord's log."""
    mr = mirrored
    forged = 'level=error comp=proxy msg="forged by a client id"'
    p = Producer(mr.proxy.conf(**{"client.id": f"evil\n{forged}", "acks": 1, "linger.ms": 100,
                                  "message.timeout.ms": 30000}))
    errs = []
    p.produce(mr.ro, b"to-mirror", partition=0, on_delivery=lambda e, m: errs.append(e))
    p.flush(30)
    del p  # no reconnects (logged with that id by librdkafka too) once the proxy is gone
    assert errs and errs[0] is not None and errs[0].code() == POLICY_VIOLATION
    m = mr.proxy.wait_log(r"refused Produce v\d+ \(client id \"evil[^\n]*", timeout=10)
    print(f"kmirrord: {m.group(0)}")
    escaped = 'client id "evil\\nlevel=error comp=proxy msg=\\"forged by a client id\\""'
    assert escaped in m.group(0)
    assert f"on topic {mr.ro} partition 0: POLICY_VIOLATION" in m.group(0)
    for line in mr.proxy.output().splitlines():
        assert "forged by a client id" not in line or "refused Produce" in line, line


def test_delete_records_topics_partitions_refused(mirrored):
    mr = mirrored
    proxy, ro, ok = mr.proxy, mr.ro, mr.ok
    produce(proxy, ok, 10)
    a = AdminClient(proxy.conf())
    with pytest.raises(KafkaException) as e:
        a.delete_topics([ro], operation_timeout=30)[ro].result(timeout=60)
    assert e.value.args[0].code() == POLICY_VIOLATION
    print(f"DeleteTopics: {e.value.args[0].str()!r}")
    mr.refusal_logged("DeleteTopics", "cannot be deleted")
    with pytest.raises(KafkaException) as e:
        a.create_partitions([NewPartitions(ro, 4)])[ro].result(timeout=60)
    assert e.value.args[0].code() == POLICY_VIOLATION
    print(f"CreatePartitions: {e.value.args[0].str()!r}")
    mr.refusal_logged("CreatePartitions", "partitions follow")
    fs = a.delete_records([TopicPartition(ro, 0, 0), TopicPartition(ok, 0, 5)])
    with pytest.raises(KafkaException) as e:
        fs[TopicPartition(ro, 0, 0)].result(timeout=60)
    print(f"DeleteRecords: {e.value.args[0]}")
    assert fs[TopicPartition(ok, 0, 5)].result(timeout=60).low_watermark == 5
    mr.refusal_logged("DeleteRecords")
    assert ro in a.list_topics(timeout=15).topics
    assert a.list_topics(ro, timeout=15).topics[ro].partitions.keys() == {0, 1}


def test_stop_makes_topic_writable(mirrored, ro_producer_cp):
    """Refused while mirrored, accepted after `kmirror stop` (Java and librdkafka, DeleteRecords)."""
    mr = mirrored
    before = java_produce(mr, ro_producer_cp, "idem")
    assert before["MIRROR"].startswith("ERROR ") and mr.message() in before["MIRROR"], before
    mr.stop()
    after = java_produce(mr, ro_producer_cp, "idem")
    assert after["MIRROR"].startswith("OK "), after
    assert after["OTHER"].startswith("OK "), after
    acked = produce(mr.proxy, mr.ro, 5, acks=1)
    assert len(acked) == 5
    p0 = sum(1 for part, _ in acked.values() if part == 0)
    assert watermarks(mr.proxy, mr.ro, 0)[1] == 1 + p0
    a = AdminClient(mr.proxy.conf())
    fs = a.delete_records([TopicPartition(mr.ro, 0, 1)])
    assert fs[TopicPartition(mr.ro, 0, 1)].result(timeout=60).low_watermark == 1


def state_topic_ends(cluster):
    """The end offsets of every partition of __mirror_state, read from the brokers directly."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"st-{uuid.uuid4().hex[:6]}"})
    try:
        md = c.list_topics("__mirror_state", timeout=15).topics["__mirror_state"]
        return {p: c.get_watermark_offsets(TopicPartition("__mirror_state", p), timeout=15)[1]
                for p in md.partitions}
    finally:
        c.close()


def state_topic_values_since(cluster, start):
    """The values of every record of __mirror_state from the offsets in start to the end."""
    end = state_topic_ends(cluster)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"st-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    values = []
    try:
        want = {p: e for p, e in end.items() if e > start.get(p, 0)}
        c.assign([TopicPartition("__mirror_state", p, start.get(p, 0)) for p in want])
        deadline = time.monotonic() + 60
        while want and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None or m.error():
                continue
            values.append(m.value())
            if m.offset() + 1 >= want.get(m.partition(), 0):
                want.pop(m.partition(), None)
        assert not want, f"__mirror_state not read to its end: {want}"
    finally:
        c.close()
    return values


def test_state_topic_never_written_through_kmirrord(mirrored, ro_producer_cp):
    """__mirror_state is refused whether a Produce names it (librdkafka) or gives its topic id (the
    Java producer against a broker with Produce v13), and nothing lands in it."""
    mr = mirrored
    before = state_topic_ends(mr.proxy.cluster)
    r = mr.proxy.cluster.run_tool("ReadOnlyProducer", mr.proxy.bootstrap, "plain", "__mirror_state", mr.ok,
                                  classpath=[ro_producer_cp], check=False, timeout=180)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert lines.get("MIRROR", "").startswith("ERROR "), r.stdout + r.stderr[-3000:]
    assert "TopicAuthorizationException" in lines["MIRROR"], lines
    assert lines["OTHER"].startswith("OK "), lines
    got = []
    p = Producer(mr.proxy.conf())
    p.produce("__mirror_state", key=b"\x00\x00", value=b"forged", on_delivery=lambda e, m: got.append(e))
    p.flush(30)
    assert got and got[0] is not None and got[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, got
    # The mirrors of earlier tests keep writing their own progress there meanwhile: look for the
    # two forged values rather than for an unchanged end.
    values = state_topic_values_since(mr.proxy.cluster, before)
    assert b"to-mirror" not in values and b"forged" not in values


def test_mirror_topic_configs_refused(mirrored):
    """While mirrored, a topic's configs follow its source: a client's change of retention.ms
    (which would delete records as a refused DeleteRecords would) or cleanup.policy is refused,
    incremental and legacy alike; mirror.name stays a mirror operation; another topic is altered."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    mr = mirrored
    a = AdminClient(mr.proxy.conf())
    direct = AdminClient({"bootstrap.servers": mr.proxy.cluster.bootstrap})

    def configs(topic):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        return {k: v.value for k, v in direct.describe_configs([res])[res].result(timeout=30).items()}

    before = configs(mr.ro)
    for name, value in (("retention.ms", "1000"), ("cleanup.policy", "compact")):
        res = ConfigResource(ConfigResource.Type.TOPIC, mr.ro, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            a.incremental_alter_configs([res])[res].result(timeout=30)
        print(f"IncrementalAlterConfigs {name}: {e.value}")
        assert e.value.args[0].code() == POLICY_VIOLATION, e.value
        assert "its configs follow its source topic's" in e.value.args[0].str()
    legacy = ConfigResource(ConfigResource.Type.TOPIC, mr.ro, set_config={"retention.ms": "1000"})
    with pytest.raises(KafkaException) as e:
        a.alter_configs([legacy])[legacy].result(timeout=30)
    print(f"AlterConfigs: {e.value}")
    assert e.value.args[0].code() == POLICY_VIOLATION, e.value
    assert configs(mr.ro) == before
    ok = ConfigResource(ConfigResource.Type.TOPIC, mr.ok, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([ok])[ok].result(timeout=30)
    # (on 3 brokers the one that answers the describe applies it from the metadata log a moment later)
    wait_until(lambda: configs(mr.ok)["retention.ms"] == "3600000", 15, 0.2, what="the other topic altered")
    mr.stop()

    def altered():
        try:
            return a.incremental_alter_configs([res])[res].result(timeout=30) is None
        except KafkaException as e:
            assert e.args[0].code() == POLICY_VIOLATION, e  # STOPPING until the pipeline has drained
            return False
    wait_until(altered, 30, 0.5, what="configs writable once STOPPED")


def test_txn_marker_never_reaches_mirror_topic(mirrored):
    """A transactional producer (librdkafka: AddPartitionsToTxn v3, then Produce) that names a
    mirror partition and aborts: the coordinator writes an ABORT marker into every partition added
    to the transaction, so AddPartitionsToTxn must be refused for it, not only the Produce. Checked
    on the destination itself: not one byte lands in the mirror topic."""
    from confluent_kafka import KafkaError
    mr = mirrored
    direct = {"bootstrap.servers": mr.proxy.cluster.bootstrap}

    def high():
        c = Consumer(dict(direct, **{"group.id": f"wm-{uuid.uuid4().hex[:6]}"}))
        try:
            return [c.get_watermark_offsets(TopicPartition(mr.ro, p), timeout=15)[1] for p in (0, 1)]
        finally:
            c.close()

    before = high()
    p = Producer(mr.proxy.conf(**{"transactional.id": f"marker-{mr.ro}", "message.timeout.ms": 15000}))
    p.init_transactions(30)
    p.begin_transaction()
    errs = []
    p.produce(mr.ro, b"to-mirror", partition=0, on_delivery=lambda e, m: errs.append(e))
    p.flush(30)
    try:
        p.commit_transaction(30)
        outcome = "committed"
    except KafkaException as e:
        outcome = f"commit failed: {e.args[0].name()}"
        try:
            p.abort_transaction(30)
            outcome += "; aborted"
        except KafkaException as e2:
            # librdkafka sends EndTxn even when the coordinator added no partition (it answers
            # INVALID_TXN_STATE, fatal): as it does for a topic its ACLs refuse on a real broker.
            outcome += f"; abort failed: {e2.args[0].name()}"
    print(f"transactional producer: delivery {errs}; {outcome}")
    time.sleep(2)  # markers are written by the coordinator after the abort returns
    assert errs and errs[0] is not None and errs[0].code() != KafkaError.NO_ERROR, errs
    assert high() == before, f"the mirror topic's end moved: {before} -> {high()} (a transaction marker)"
    mr.proxy.wait_log(rf"refused AddPartitionsToTxn v\d+ .*: TOPIC_AUTHORIZATION_FAILED: topic {re.escape(mr.ro)} ", 10)
