"""The state topic's cleanup.policy (docs/state.md, "The state topic's policy"): a state topic made
directly on the destination that is not compacted (delete, or compact,delete) is never read nor
written by kmirrord, which logs why and what to run, and exits 1; whether it was there at start or
appeared before the first write. A compacted one made the same way is used as before. A swap's
store that finds the topic not compacted fails the swap, and kmirrord goes on."""

import json
import subprocess
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from harness import Daemon
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_configs import Client

pytestmark = [pytest.mark.proxy, main_release_only]


def make_state_topic(cluster, policy):
    """The state topic as anyone with access to the brokers could make it (not through kmirrord)."""
    name = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    a.create_topics([NewTopic(name, 2, 1, config={"cleanup.policy": policy})],
                    operation_timeout=30)[name].result(timeout=60)
    cluster.wait_topic(name, 2)
    return name


def exit_status(p, timeout=60):
    """The exit status of p's kmirrord, failing when it is still running after timeout."""
    try:
        return p.daemon.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kmirrord kept running (it used the state topic):\n{p.daemon.tail()}", pytrace=False)


def refusal(topic, policy):
    return (f"{topic} has cleanup.policy={policy}: kmirrord keeps its state there only in a compacted topic "
            f"(")


@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_state_topic_not_compacted_stops_kmirrord(proxy_factory, dest_cluster, policy):
    state_topic = make_state_topic(dest_cluster, policy)
    p = proxy_factory(dest_cluster, start=False, mirror_state_topic=state_topic)
    # Not Proxy.start: it waits for the listener, which a quick exit may close before it is seen.
    p.daemon = Daemon([p.binary, "--config", p.config_path], p.name, p.log_dir).start()
    status = exit_status(p)
    out = p.output()
    print(out[-3000:])
    assert status == 1, status
    assert refusal(state_topic, policy) in out, out[-3000:]
    fix = (f"kafka-configs --alter --entity-type topics --entity-name {state_topic} "
           f"--add-config cleanup.policy=compact, or point mirror_state_topic at another topic")
    assert fix in out
    assert "level=error" in out.split(refusal(state_topic, policy))[0].splitlines()[-1]
    # Never read: no load was logged, and it still holds nothing (kmirrord wrote nothing either).
    assert f"read {state_topic}:" not in out
    assert "mirror state ready" not in out


def test_state_topic_made_before_the_first_write(proxy_factory, dest_cluster):
    """Absent at start (empty state, ready); made with cleanup.policy=delete before the first
    CreateMirror: the write is refused with the reason and kmirrord stops."""
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    wait_until(lambda: p.http_get("/readyz")[0] == 200, 60, what="kmirrord ready")
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    a.create_topics([NewTopic(state_topic, 1, 1, config={"cleanup.policy": "delete"})],
                    operation_timeout=30)[state_topic].result(timeout=60)
    dest_cluster.wait_topic(state_topic, 1)
    c = Client(p.bootstrap)
    try:
        code, msg = c.create(f"m-{uuid.uuid4().hex[:8]}", {"bootstrap.servers": dest_cluster.bootstrap})
    finally:
        c.close()
    print("create:", code, msg)
    assert code != 0, "the mirror was written to a topic with cleanup.policy=delete"
    assert refusal(state_topic, "delete") in msg
    assert exit_status(p) == 1
    assert refusal(state_topic, "delete") in p.output()
    md = AdminClient({"bootstrap.servers": dest_cluster.bootstrap}).list_topics(state_topic, timeout=30)
    parts = md.topics[state_topic].partitions
    from confluent_kafka import Consumer, TopicPartition
    cons = Consumer({"bootstrap.servers": dest_cluster.bootstrap, "group.id": uuid.uuid4().hex})
    try:
        for i in parts:
            lo, hi = cons.get_watermark_offsets(TopicPartition(state_topic, i), timeout=30)
            assert hi == 0, f"partition {i} holds {hi} records"
    finally:
        cons.close()


def test_state_topic_made_compacted_elsewhere_is_used(proxy_factory, dest_cluster):
    state_topic = make_state_topic(dest_cluster, "compact")
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    wait_until(lambda: p.http_get("/readyz")[0] == 200, 60, what="kmirrord ready")
    c = Client(p.bootstrap)
    try:
        code, msg = c.create(f"m-{uuid.uuid4().hex[:8]}", {"bootstrap.servers": dest_cluster.bootstrap})
        assert code == 0, msg
    finally:
        c.close()
    assert p.running()
    assert "cleanup.policy" not in p.output()


def test_swap_to_a_state_topic_not_compacted_fails(proxy_factory, dest_cluster, tmp_path):
    """A store prepared for an upstream swap that finds the state topic not compacted fails the
    swap with its message; kmirrord keeps fronting its upstream. The same cluster under another
    address stands for the new upstream: its state topic is altered to delete on the brokers after
    kmirrord read it (which the running store does not check again until its next load)."""
    state_topic = make_state_topic(dest_cluster, "compact")
    token = "swap-" + uuid.uuid4().hex
    (tmp_path / "admin.token").write_text(token + "\n")
    (tmp_path / "admin.token").chmod(0o600)
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic, upstream_file=str(tmp_path / "upstream"),
                      admin_token_file=str(tmp_path / "admin.token"))
    wait_until(lambda: p.http_get("/readyz")[0] == 200, 60, what="kmirrord ready")
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, state_topic,
                         incremental_configs=[ConfigEntry("cleanup.policy", "delete",
                                                          incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res])[res].result(timeout=30)
    host, port = dest_cluster.bootstrap.split(",")[0].rsplit(":", 1)
    other = f"localhost:{port}" if host != "localhost" else f"127.0.0.1:{port}"
    status, body = p.http("POST", "/admin/upstream", other, token=token)
    print("swap:", status, body)
    assert status in (200, 202), (status, body)

    def swap_status():
        status, body = p.http("GET", "/admin/upstream", token=token)
        assert status == 200, (status, body)
        return json.loads(body)
    st = wait_until(lambda: (lambda s: s if s["swapping_to"] is None else None)(swap_status()), 90,
                    what="the swap to end")
    print(st)
    assert refusal(state_topic, "delete") in st["last_swap"], st
    assert st["upstream"] == p.options["upstream"], st
    assert p.running()
    assert p.http_get("/readyz")[0] == 200
