"""The state store under load and faults, through kmirrord and the kmirror CLI: a start of a topic
with 200 partitions settled by the driver (timed, start to all MIRRORING), and a write to
__mirror_state whose partition leader goes away (3 brokers): the store retries and answers, and
what it holds in memory equals what a fresh kmirrord reads back."""

import re
import threading
import time

import pytest

from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_cli import Cli, kmirror_bin, topic_states, unique  # noqa: F401

# Release-independent: on the pom's release only (mirror_data.ON_MAIN_RELEASE).
pytestmark = main_release_only


def _states_full(cli, mirror):
    """{topic: [(partition, state, state_change_ms, last_mirrored_offset)]} from describe."""
    doc, _ = cli.json("describe", "--mirror", mirror)
    m = doc["mirrors"][0]
    return {t["name"]: sorted((p["partition"], p["state"], p["state_change_time_ms"],
                               p["mirrored_offset"], p["last_error"]) for p in t["partitions"])
            for t in m["topics"]}


def test_start_200_partitions(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    state_topic = unique("__mirror_state_scale")
    proxy = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror, topic = unique("scale"), unique("wide")
    dest_cluster.create_topic(topic, partitions=200)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)

    t0 = time.monotonic()
    cli.run("start", "--mirror", mirror, "--topics", topic)
    t_start = time.monotonic() - t0

    def all_mirroring():
        st = topic_states(cli, mirror).get(topic, [])
        return len(st) == 200 and all(s == "MIRRORING" for s in st)
    wait_until(all_mirroring, 120, 0.05, what="200 partitions MIRRORING")
    t_all = time.monotonic() - t0
    log = proxy.output()
    writes = len(re.findall(r"PREPARING -> MIRRORING", log))
    print(f"start answered in {t_start * 1000:.0f} ms; all 200 MIRRORING after {t_all * 1000:.0f} ms "
          f"({writes} partition transitions logged)")
    assert writes == 200
    # One store write settles them all now (200 writes of one record each took ~1.5 s before).
    assert t_all < 10, f"start -> all MIRRORING took {t_all:.1f} s"


def _leader_of(cluster, topic, partition):
    d = cluster.tool("topics", "--describe", "--topic", topic).stdout
    for line in d.splitlines():
        m = re.search(r"Partition:\s*(\d+)\s+Leader:\s*(-?\d+)", line)
        if m and int(m.group(1)) == partition:
            return int(m.group(2))
    raise AssertionError(f"no leader for {topic}-{partition} in:\n{d}")


def test_write_while_leader_goes(kmirror_bin, dest_cluster3, source_cluster, proxy_factory):
    cluster = dest_cluster3
    # One state partition: every record goes to it, so its leader is the broker to take away.
    state_topic = unique("__mirror_state_fault")
    proxy = proxy_factory(cluster, mirror_state_topic=state_topic, mirror_state_partitions=1)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror, topic = unique("fault"), unique("orders")
    cluster.create_topic(topic, partitions=3)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", mirror, "--topics", topic)
    wait_until(lambda: topic_states(cli, mirror).get(topic) == ["MIRRORING"] * 3, 30, 0.1,
               what="MIRRORING")
    leader = _leader_of(cluster, state_topic, 0)
    before = len(proxy.output().splitlines())
    stopped = []
    try:
        # Stop the leader while the pause is being written: the broker's controlled shutdown moves
        # leadership and closes the store's connection under the write in flight.
        th = threading.Thread(target=lambda: (cluster.stop_broker(leader), stopped.append(leader)))
        th.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        r = cli.run("pause", "--mirror", mirror, "--topics", topic, timeout=120)
        t_pause = time.monotonic() - t0
        th.join(60)
        assert stopped == [leader]
        # A mutation after the stop finds the old leader's connection gone: retried on the new one.
        t1 = time.monotonic()
        cli.run("resume", "--mirror", mirror, "--topics", topic, expect=None)
        wait_until(lambda: topic_states(cli, mirror).get(topic) in (["MIRRORING"] * 3,), 60, 0.1,
                   what="MIRRORING again")
        t_resume = time.monotonic() - t1
        log = proxy.output()
        retries = [ln for ln in log.splitlines()[before:] if "retrying in" in ln]
        print(f"leader {leader} stopped; pause answered in {t_pause * 1000:.0f} ms "
              f"({r.stdout.strip()}), resume settled in {t_resume * 1000:.0f} ms; retries logged:")
        print("\n".join(retries))
        assert retries, "no retried write in the log"
        assert _leader_of(cluster, state_topic, 0) != leader

        # Memory equals a fresh read of __mirror_state: a second kmirrord on the same topic.
        mem = _states_full(cli, mirror)
        fresh = proxy_factory(cluster, mirror_state_topic=state_topic, mirror_state_partitions=1)
        cli2 = Cli(kmirror_bin, fresh.bootstrap)
        wait_until(lambda: cli2.run("describe", "--mirror", mirror, expect=None).returncode == 0, 60,
                   0.2, what="the fresh kmirrord's state")
        assert _states_full(cli2, mirror) == mem
        print(f"memory == fresh load: {mem}")
    finally:
        if stopped or leader not in [n for n in cluster.broker_ids if cluster.nodes[n].running()]:
            cluster.start_broker(leader)
