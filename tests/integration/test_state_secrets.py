"""kmirrord's secrets on real Kafka: a mirror_secret_key_file others may read stops kmirrord at start
(and starts it with the check off, or once chmod 600); upstream_sasl_password_file logs kmirrord in
to the destination's SASL listener (mode checked, exclusive with the inline password, read again on
SIGHUP; the inline password given as a flag draws a warning); and a mirror's sealed password copied
into another mirror's record in __mirror_state does not open there: that mirror's start is refused
naming the key, the log names the mirror, and the mirror it was sealed for still works."""

import os
import signal
import subprocess
import uuid

import pytest

from harness import USERS, Daemon
from mirror_cli import Cli, kmirror_bin  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]  # sealing and secret files are kmirrord's own: once, on the suite's release


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def secret_file(tmp_path, name, text, mode):
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def exit_of(proxy, timeout=30):
    """Runs kmirrord on proxy's config expecting it to exit: (status, output). A kmirrord still
    running after timeout is stopped and the test fails."""
    p = subprocess.Popen([proxy.binary, "--config", proxy.config_path], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"kmirrord kept running, wanted it to refuse to start:\n{out[-3000:]}")
    return p.returncode, out


# ---- mirror_secret_key_file ------------------------------------------------------------------

def test_key_file_mode(proxy_factory, dest_cluster, tmp_path):
    key = secret_file(tmp_path, "mirror.key", os.urandom(32).hex() + "\n", 0o644)
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    p = proxy_factory(dest_cluster, start=False, mirror_secret_key_file=key, mirror_state_topic=state_topic,
                      mirror_state_partitions=1)
    status, out = exit_of(p)
    print(out)  # with pytest -s: what an operator reads
    assert status == 1, out
    assert f"mirror_secret_key_file {key} can be read or changed by group or others (mode 0644): " \
           f"run chmod 600 {key}" in out, out

    # The check off: kmirrord starts, and says what is wrong.
    p.options["secret_file_mode_check"] = "false"
    p.write_config()
    p.start()
    p.wait_log(r"level=warn comp=state msg=\"mirror_secret_key_file .* used because secret_file_mode_check "
               r"is false: run chmod 600")
    p.wait_log("mirror state ready")
    assert p.stop() == 0

    # chmod 600: it starts, with no warning.
    os.chmod(key, 0o600)
    del p.options["secret_file_mode_check"]
    p.write_config()
    before = len(p.output())
    p.start()
    p.wait_log("mirror state ready", start=before)
    assert "secret_file_mode_check" not in p.output()[before:]


# ---- upstream_sasl_password_file -------------------------------------------------------------

def sasl_options(dest_cluster, **more):
    return dict(upstream=dest_cluster.sasl_bootstrap, upstream_sasl_mechanism="SCRAM-SHA-512",
                upstream_sasl_username="admin", mirror_state_topic=f"__mirror_state_{uuid.uuid4().hex[:8]}",
                mirror_state_partitions=1, **more)


def test_upstream_sasl_password_file(proxy_factory, dest_cluster, tmp_path):
    pw = secret_file(tmp_path, "upstream.pw", USERS["admin"] + "\n", 0o600)
    p = proxy_factory(dest_cluster, **sasl_options(dest_cluster, upstream_sasl_password_file=pw))
    # The proxy's own login (its metadata) and the state store's (the state topic read back).
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 60, what="the proxy's SCRAM login")
    p.wait_log("mirror state ready", timeout=60)
    assert USERS["admin"] not in p.output()
    # --print-config names the file and prints no password.
    r = subprocess.run([p.binary, "--config", p.config_path, "--print-config"], stdout=subprocess.PIPE, text=True)
    assert f"upstream_sasl_password_file = {pw}" in r.stdout and USERS["admin"] not in r.stdout
    assert p.stop() == 0

    # Others may read it: refused (an invalid configuration), saying what to run.
    os.chmod(pw, 0o644)
    status, out = exit_of(p)
    assert status == 2, out
    assert f"upstream_sasl_password_file {pw} can be read or changed by group or others (mode 0644): " \
           f"run chmod 600 {pw}" in out, out
    os.chmod(pw, 0o600)
    # Both forms: refused.
    p.options["upstream_sasl_password"] = USERS["admin"]
    p.write_config()
    status, out = exit_of(p)
    assert status == 2 and "upstream_sasl_password and upstream_sasl_password_file: set one of them" in out, out


def test_upstream_sasl_password_file_reload(proxy_factory, dest_cluster, tmp_path):
    """A wrong password in the file: the proxy cannot log in; the right one written and SIGHUP: it
    does, without a restart."""
    pw = secret_file(tmp_path, "upstream.pw", "not-the-password\n", 0o600)
    p = proxy_factory(dest_cluster, **sasl_options(dest_cluster, upstream_sasl_password_file=pw))
    p.wait_log(r"SASL authentication to .* failed", timeout=60)
    assert p.metric("kmirror_upstream_brokers") == 0
    with open(pw, "w") as f:
        f.write(USERS["admin"] + "\n")
    mark = len(p.output())
    p.signal(signal.SIGHUP)
    p.wait_log("configuration reloaded", start=mark)
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 60, what="the proxy's login after the reload")


def test_inline_password_flag_warns(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, start=False, **sasl_options(dest_cluster))
    p.daemon = Daemon([p.binary, "--config", p.config_path, "--upstream-sasl-password", USERS["admin"]], p.name,
                      p.log_dir)
    p.daemon.start(port=p.port, host=PROXY_HOST)
    p.wait_log(r"level=warn comp=main msg=\"upstream_sasl_password given on the command line is visible to "
               r"every user of this host in the process list: put it in a file only kmirrord can read and set "
               r"upstream_sasl_password_file instead\"")
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 60, what="the proxy's SCRAM login")
    assert USERS["admin"] not in p.output()


# ---- a sealed value moved to another mirror --------------------------------------------------

def consume_all(cluster, topic, timeout=30.0):
    """[(partition, key, value)] of every record of topic, read from the brokers (not through kmirrord)."""
    import time
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("raw"),
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        left, out = set(parts), []
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
                    continue
                raise AssertionError(f"consuming {topic}: {m.error()}")
            out.append((m.partition(), m.key(), m.value()))
        assert not left, f"{topic}: partitions {sorted(left)} not read to the end"
        return out
    finally:
        c.close()


def mirror_key(name):
    """The record key of a mirror: int16 type 0, then MirrorStateMirrorKey v0 (int16-length string)."""
    return b"\x00\x00" + len(name).to_bytes(2, "big") + name.encode()


def copy_mirror_record(cluster, state_topic, src, dst):
    """Writes mirror src's last record again as mirror dst's, straight to the brokers: the same
    configuration, its sealed password included (the names have one length, so the value's encoding
    holds)."""
    from confluent_kafka import Producer
    assert len(src) == len(dst)
    values = [v for _, k, v in consume_all(cluster, state_topic) if k == mirror_key(src)]
    assert values and values[-1], f"no record of mirror {src} in {state_topic}"
    value = values[-1]
    assert value.count(src.encode()) == 1
    prod = Producer({"bootstrap.servers": cluster.bootstrap, "partitioner": "murmur2_random", "acks": "all"})
    prod.produce(state_topic, key=mirror_key(dst), value=value.replace(src.encode(), dst.encode()))
    assert prod.flush(30) == 0


def test_sealed_value_moved_to_another_mirror(kmirror_bin, proxy_factory, dest_cluster, source_cluster, tmp_path):
    key = secret_file(tmp_path, "mirror.key", os.urandom(32).hex() + "\n", 0o600)
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    p = proxy_factory(dest_cluster, mirror_secret_key_file=key, mirror_state_topic=state_topic,
                      mirror_state_partitions=4)
    cli = Cli(kmirror_bin, p.bootstrap)
    tag = uuid.uuid4().hex[:6]
    alpha, bravo = f"alpha-{tag}", f"bravo-{tag}"
    topics = [unique("moved") for _ in range(3)]
    for t in topics:
        source_cluster.create_topic(t)
    props = secret_file(tmp_path, "source.properties",
                        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                        f"sasl.password={USERS['admin']}\nmirror.acl.include=\nmirror.groups.include=\n", 0o600)
    cli.run("create", "--mirror", alpha, "--source-bootstrap", source_cluster.sasl_bootstrap,
            "--config-file", props)
    # alpha's password opens: starting a topic the destination lacks asks alpha's source for it.
    cli.run("start", "--mirror", alpha, "--topics", topics[0])

    copy_mirror_record(dest_cluster, state_topic, alpha, bravo)
    assert p.stop() == 0
    mark = len(p.output())
    p.start()
    p.wait_log("mirror state ready", start=mark)
    doc, _ = cli.json("describe", "--mirror", bravo)
    assert {"name": "sasl.password", "value": None, "sensitive": True} in doc["mirrors"][0]["configs"]

    # bravo holds alpha's sealed password: it does not open there.
    err, _, _ = cli.refused("INVALID_CLUSTER_MIRROR_CONFIG", "start", "--mirror", bravo, "--topics", topics[1],
                            json_too=False)
    print("refused:", err)
    assert "sasl.password does not open for this mirror" in err, err
    p.wait_log(rf"level=error comp=state msg=\"mirror '{bravo}': sasl.password does not open", start=mark)
    assert f"mirror '{alpha}': sasl.password does not open" not in p.output()
    # alpha's still does.
    cli.run("start", "--mirror", alpha, "--topics", topics[2])
    # Set again for bravo, it opens there too.
    cli.run("alter", "--mirror", bravo, "--config-file", props)
    cli.run("start", "--mirror", bravo, "--topics", topics[1])
    assert USERS["admin"] not in p.output()
