"""The last tests of a run, on every worker (a serial run takes them last because the file name
sorts after the other modules; a parallel one by worker_sched.py, which sends each worker's
`per_worker` copy to that worker after everything else): the session proxy exits cleanly, and a
scan of every byte that any proxy of the worker sent to its clients (captured on the loopback
interface from the start) finds no upstream host:port. A negative control proves that the
capture and the scan find a leak when there is one."""

import os
import signal
import struct
import subprocess

import pytest
from confluent_kafka.admin import AdminClient

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import (Capture, TcpRelay, leak_patterns, read_pcap_flows, scan_flows,
                            upstream_ports, wait_until, worker_index)

pytestmark = pytest.mark.proxy

CONTROL_HOST = f"127.0.{worker_index()}.3"


@pytest.fixture(autouse=True)
def on_its_worker(per_worker):
    """Each copy checks the worker it is named for: run elsewhere it would scan the wrong capture."""
    worker_id = os.environ.get("PYTEST_XDIST_WORKER", "none")
    if per_worker != "main":
        assert worker_id == per_worker, (
            f"{per_worker}'s leak scan ran on {worker_id}: run the suite with its own scheduler "
            "(-n N with the default --dist, worker_sched.py)")


def describe_hits(hits, limit=10):
    return "\n".join(f"{src}:{sport} -> {dst}:{dport} at byte {off}: {m!r} in {ctx!r}"
                     for (src, sport, dst, dport, _), off, m, ctx in hits[:limit])


def test_negative_control_direct_traffic_leaks(dest_cluster3, tmp_path):
    """A relay that forwards to a broker without rewriting, captured and scanned exactly like the
    proxies: the scan must find the broker's real address in what the client received."""
    cap = Capture(str(tmp_path), host=CONTROL_HOST, name="control").start()
    if cap.error:
        pytest.fail(f"cannot capture: {cap.error}")
    host, port = dest_cluster3.broker_address(dest_cluster3.broker_ids[0]).split(":")
    relay = TcpRelay(CONTROL_HOST, (host, int(port)))
    try:
        r = subprocess.run(["kcat", "-L", "-b", f"{CONTROL_HOST}:{relay.port}", "-m", "15"],
                           stdout=subprocess.PIPE, text=True, timeout=60)
        assert r.returncode == 0 and "brokers" in r.stdout
    finally:
        relay.close()
    # The capture is written as it goes: read until the broker's answer is in (a loaded machine), then stop.
    wait_until(lambda: cap.files and read_pcap_flows(cap.files)[0] and
               scan_flows(read_pcap_flows(cap.files)[0], leak_patterns(upstream_ports([dest_cluster3]))), 20,
               what="the broker's answer captured")
    cap.stop()
    flows, problems = read_pcap_flows(cap.files)
    assert not problems, problems
    assert all(k[0] == CONTROL_HOST and k[1] == relay.port for k in flows)
    hits = scan_flows(flows, leak_patterns(upstream_ports([dest_cluster3])))
    # Every broker's CLIENT endpoint, as Metadata encodes it (host string, int32 port).
    for node in dest_cluster3.broker_ids:
        h, p = dest_cluster3.broker_address(node).split(":")
        assert any(h.encode() + struct.pack(">i", int(p)) in m for _, _, m, _ in hits), \
            describe_hits(hits)


def test_session_proxies_exit_cleanly(proxy3_session):
    """The session proxy drains on SIGTERM, exits 0, and printed no sanitizer report."""
    # Run alone, this module still has a session proxy and one client exchange to scan.
    a = AdminClient(proxy3_session.get().conf())
    assert len(a.list_topics(timeout=15).brokers) == 3
    for p in proxy3_session.all:
        if p.running():
            p.final_bytes_out = p.metric("kmirror_client_bytes_out_total")
            p.signal(signal.SIGTERM)
            assert p.daemon.proc.wait(timeout=60) == 0, p.daemon.tail()
        assert p.daemon.proc.returncode == 0, p.daemon.tail()
        assert p.sanitizer_reports() == [], "\n".join(p.sanitizer_reports()[:30])


def test_no_upstream_address_reaches_clients(proxy_capture, proxy3_session, dest_cluster3):
    if proxy_capture.error:
        pytest.fail(f"the capture did not run: {proxy_capture.error}")
    assert proxy_capture.running, "tcpdump died during the session"
    proxy_capture.stop()
    assert proxy_capture.dropped() == 0, proxy_capture.stats
    flows, problems = read_pcap_flows(proxy_capture.files)
    assert not problems, problems[:10]
    total = sum(len(v) for v in flows.values())
    assert flows and total > 0
    # The capture is complete: for the session proxy it holds what the proxy counted as sent
    # to clients, less what was queued to clients that had already hung up (a consumer closed
    # with a fetch answer in flight: about 0.1 % in most runs, 3 % once, one 5-KB answer of a
    # session that moved 160 KB). A wrong interface, filter or a dead tcpdump would miss nearly
    # everything; lost packets and holes are caught above.
    for p in proxy3_session.all:
        ports = {p.port} | {p.broker_port(n) for n in range(8)}
        captured = sum(len(v) for k, v in flows.items() if k[1] in ports)
        if hasattr(p, "final_bytes_out"):
            assert p.final_bytes_out > 0
            assert captured >= p.final_bytes_out * 0.9, (captured, p.final_bytes_out)
    hits = scan_flows(flows, leak_patterns(upstream_ports([dest_cluster3])))
    assert not hits, (f"{len(hits)} upstream addresses in {total} bytes sent to clients:\n"
                      + describe_hits(hits))
