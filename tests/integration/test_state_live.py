"""The state store (src/state) against the destination cluster, 1 and 3 brokers: runs the cmocka
program tests/unit/test_state_live (create a mirror with a password, start a topic, restart the
store, refusals, stop, delete; offset map runs: restart, tombstones, 10,000 runs, delete), then
reads __mirror_state's segment files and a consumer's view of it and checks that the password is
in neither, and reads the runs' state topic raw: after the delete no run key's last value is a
run."""

import os
import secrets
import subprocess
import time
import uuid

import pytest


def live_binary():
    kmirrord = os.environ.get("KMIRRORD")
    if not kmirrord:
        from conftest import find_kmirrord
        kmirrord = find_kmirrord()
    if not kmirrord:
        pytest.skip("no build found (set KMIRRORD=<build>/kmirrord)")
    path = os.path.join(os.path.dirname(kmirrord), "tests", "unit", "test_state_live")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} not built (make check builds it)")
    return path


def test_state_live(cluster, topic_name, tmp_path):
    binary = live_binary()
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    password = "pw-" + secrets.token_hex(12)
    key = tmp_path / "mirror.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    cluster.create_topic(topic_name, partitions=3)
    env = dict(os.environ, KM_TEST_BOOTSTRAP=cluster.bootstrap, KM_TEST_TOPIC=topic_name,
               KM_TEST_STATE_TOPIC=state_topic, KM_TEST_KEY_FILE=str(key),
               KM_TEST_PASSWORD=password)
    t0 = time.monotonic()
    r = subprocess.run([binary], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    print(r.stdout)
    print(f"test_state_live took {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout[-4000:]
    assert "[  PASSED  ] 3 test(s)." in r.stdout
    assert "SKIPPED" not in r.stdout
    assert "# done" in r.stdout
    assert "# runs done" in r.stdout
    assert "# grow done" in r.stdout
    # km_mirror_grow grew the destination topic from 3 to the source's 5 partitions.
    d = cluster.tool("topics", "--describe", "--topic", topic_name).stdout
    assert d.count("Partition:") == 5, d
    # No log line carries the password.
    assert password not in r.stdout

    # The topic as kmirrord made it: compacted, 4 partitions, RF min(3, brokers).
    d = cluster.tool("topics", "--describe", "--topic", state_topic).stdout
    assert "cleanup.policy=compact" in d, d
    assert d.count("Partition:") == 4, d
    rf = min(3, cluster.n_brokers)
    assert f"ReplicationFactor: {rf}" in d, d
    assert f"min.insync.replicas={2 if rf >= 3 else 1}" in d, d

    # Raw bytes on disk, every partition on every replica: records were written (the mirror's
    # name is there in clear) but the password never was.
    total = 0
    for p in range(4):
        for directory in cluster.partition_dirs(state_topic, p):
            for f in os.listdir(directory):
                if f.endswith(".log"):
                    data = open(os.path.join(directory, f), "rb").read()
                    total += len(data)
                    assert password.encode() not in data, f"{directory}/{f} holds the password"
    assert total > 0
    consumed = subprocess.run(["kcat", "-b", cluster.bootstrap, "-C", "-t", state_topic, "-e",
                               "-q", "-f", "%k %s\n"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert b"source-a:9092" in consumed.stdout
    assert b"sasl.password" in consumed.stdout
    assert password.encode() not in consumed.stdout
    print(f"raw segment bytes checked: {total}, consumed bytes: {len(consumed.stdout)}")

    # The runs' state topic read raw: run records (type 2) were written, and after the delete
    # every run key's last record is a tombstone (compaction aside, what a reader rebuilds from).
    from confluent_kafka import Consumer, TopicPartition
    runs_topic = state_topic + "-runs"
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "km-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    try:
        md = c.list_topics(runs_topic, timeout=30).topics[runs_topic]
        last, runs_seen = {}, 0
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(runs_topic, p), timeout=30)
            if hi <= lo:
                continue
            c.assign([TopicPartition(runs_topic, p, lo)])
            got = lo
            deadline = time.monotonic() + 60
            while got < hi and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is None or m.error():
                    continue
                got = m.offset() + 1
                key = m.key()
                if key[:2] == b"\x00\x02":
                    runs_seen += 1
                    last[key] = m.value()
            assert got >= hi, f"partition {p}: read to {got} of {hi}"
    finally:
        c.close()
    live = [k for k, v in last.items() if v is not None]
    print(f"run records read: {runs_seen}, run keys: {len(last)}, live after delete: {len(live)}")
    assert len(last) >= 10004
    assert runs_seen >= 2 * len(last)  # each written, then tombstoned
    assert not live
