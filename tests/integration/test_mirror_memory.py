"""The mirror's memory bound (docs/mirror.md, "Flow control"): kmirrord catches up a lag of
KM_MIRROR_LAG_MB of 1 KB records (default 256 MB, 2048 MB with KM_LONG=1 or --long) over 8
partitions, written fast by the Java producer perf test (lz4), with mirror.fetch.max.bytes 8 MiB
and mirror.fetch.partition.max.bytes 1 MiB; kmirrord's RSS (VmRSS) is sampled every 100 ms during
the catch-up and its peak must stay under the documented bound: the RSS idle with the mirror
created + (2 + 2 x source brokers) x fetch.max.bytes + a margin (a Fetch in flight on each of a
source broker's two fetch lanes) (KM_MIRROR_RSS_MARGIN_MB, default
16). A 64 MB lag is caught up too, and its peak and the large lag's differ by less than the
margin: memory does not grow with the lag. Each size gets a fresh kmirrord (so a peak is its
own, not one left by the size before)."""

import os
import threading
import time
import uuid

import pytest

from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import create_dest_topic, env_int, long_run, main_release_only, progress, wait_caught_up, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

PARTS = 8
RECORD = 1024
FETCH_MAX = 8 * 1024 * 1024
FETCH_IN_FLIGHT = 2  # fetch.max.bytes in flight per source broker: the sessions share one, the side lane one (pipeline.h)
PART_MAX = 1024 * 1024
LAG_MB = env_int("KM_MIRROR_LAG_MB", 2048 if long_run() else 256)
SMALL_MB = 64
MARGIN = env_int("KM_MIRROR_RSS_MARGIN_MB", 16) * 1024 * 1024
SAMPLE_S = 0.1

# Peak and baseline RSS (bytes) per lag size, for the comparison test at the end.
_measured = {}


def rss(pid):
    """VmRSS of pid in bytes (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples a pid's RSS every SAMPLE_S seconds from a thread: peak, samples, when the peak was."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = 0
        self.samples = 0
        self.peak_at = 0.0
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            v = rss(self.pid)
            if v is not None:
                self.samples += 1
                if v > self.peak:
                    self.peak, self.peak_at = v, time.monotonic() - self._t0
            self._stop.wait(SAMPLE_S)

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        return self.peak


def sanitized(binary):
    """Whether the binary was built with AddressSanitizer (its shadow memory and quarantine make
    RSS meaningless for this bound)."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def mb(n):
    return f"{n / 1048576:.1f} MB"


def perf_produce(source, topic, total_mb):
    """total_mb of 1 KB records into topic from the Java producer perf test (lz4, as fast as it
    goes); returns the record count."""
    n = total_mb * 1024 * 1024 // RECORD
    r = source.run_tool("producer-perf-test", "--topic", topic, "--num-records", n,
                        "--record-size", RECORD, "--throughput", -1, "--producer-props",
                        f"bootstrap.servers={source.bootstrap}", "compression.type=lz4",
                        "acks=1", "linger.ms=20", "batch.size=262144", "buffer.memory=134217728",
                        timeout=600)
    assert f"{n} records sent" in r.stdout, r.stdout[-2000:]
    return n


@pytest.fixture
def mem_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path):
    """A fresh kmirrord in front of the destination with one mirror of the source (the fetch
    sizes of the test), deleted afterwards so that later kmirrords of the suite do not load it."""
    if sanitized(kmirrord_bin):
        pytest.skip("kmirrord built with sanitizers: RSS is not the daemon's own")
    proxy = Proxy(kmirrord_bin, dest_cluster, str(tmp_path), name="kmirrord-mem").start()
    wait_until(lambda: proxy.metric("kmirror_upstream_brokers") >= len(dest_cluster.broker_ids), 30,
               what="kmirrord to learn the brokers")
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = f"mem-{uuid.uuid4().hex[:8]}"
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
            "--config", f"mirror.fetch.max.bytes={FETCH_MAX}",
            "--config", f"mirror.fetch.partition.max.bytes={PART_MAX}")
    try:
        yield proxy, cli, mirror
    finally:
        try:
            if proxy.running():
                cli.run("stop", "--mirror", mirror, "--topics-regex", ".*", expect=None)
                cli.run("delete", "--mirror", mirror, expect=None)
        finally:
            proxy.stop()


def source_brokers(source_cluster):
    return len(source_cluster.broker_ids)


def catch_up_peak(mem_env, source_cluster, dest_cluster, lag_mb):
    """Produces lag_mb at the source, measures the idle baseline, starts the mirror and samples
    RSS until the catch-up is done; returns (baseline, peak, bound, seconds)."""
    proxy, cli, mirror = mem_env
    pid = proxy.daemon.pid
    topic = f"mem-{lag_mb}mb-{uuid.uuid4().hex[:6]}"
    source_cluster.create_topic(topic, partitions=PARTS)
    t0 = time.monotonic()
    n = perf_produce(source_cluster, topic, lag_mb)
    progress(f"{topic}: {n} records ({lag_mb} MB) produced in {time.monotonic() - t0:.1f}s")
    # The baseline: idle, the mirror created (its source client is made at start, so what it
    # costs is inside the bound's fetch term, not the baseline), sampled over a second.
    base = RssSampler(pid).start()
    time.sleep(1.0)
    baseline = base.stop()
    bound = baseline + (2 + FETCH_IN_FLIGHT * source_brokers(source_cluster)) * FETCH_MAX + MARGIN
    create_dest_topic(dest_cluster, source_cluster.bootstrap, topic)
    sampler = RssSampler(pid).start()
    t1 = time.monotonic()
    try:
        cli.run("start", "--mirror", mirror, "--topics", topic)
        wait_states(cli, mirror, {topic: "MIRRORING"}, timeout=60)
        marks = wait_caught_up(proxy.bootstrap, source_cluster.bootstrap, topic, PARTS,
                               timeout=900, stall=60,
                               describe=lambda: described(cli, mirror)["topics"])
    finally:
        peak = sampler.stop()
    took = time.monotonic() - t1
    assert sum(hi - lo for lo, hi in marks) == n
    assert watermarks(proxy.bootstrap, topic, PARTS) == marks
    progress(f"{topic}: {lag_mb} MB caught up in {took:.1f}s ({lag_mb / took:.0f} MB/s); RSS "
             f"baseline {mb(baseline)}, peak {mb(peak)} ({peak - baseline} bytes over the baseline,"
             f" at {sampler.peak_at:.1f}s, {sampler.samples} samples), bound {mb(bound)} "
             f"(baseline + (2 + {FETCH_IN_FLIGHT} x {source_brokers(source_cluster)}) x {mb(FETCH_MAX)} + margin "
             f"{mb(MARGIN)})")
    assert sampler.samples >= took / SAMPLE_S / 4, "RSS sampled too rarely"
    # The samples saw the fetched data (the right process, while it worked): at least one
    # partition's fetch over the idle figure.
    assert peak > baseline + PART_MAX, f"RSS peak {mb(peak)} hardly over idle {mb(baseline)}"
    cli.run("stop", "--mirror", mirror, "--topics", topic)
    source_cluster.tool("topics", "--delete", "--topic", topic, check=False)
    dest_cluster.tool("topics", "--delete", "--topic", topic, check=False)
    return baseline, peak, bound, took


@pytest.mark.parametrize("lag_mb", [SMALL_MB, LAG_MB], ids=lambda v: f"{v}MB")
def test_mirror_memory_bound(mem_env, source_cluster, dest_cluster, lag_mb):
    baseline, peak, bound, took = catch_up_peak(mem_env, source_cluster, dest_cluster, lag_mb)
    _measured[lag_mb] = (baseline, peak)
    assert peak < bound, (f"RSS peak {mb(peak)} over the bound {mb(bound)} (baseline "
                          f"{mb(baseline)}) catching up {lag_mb} MB")


def test_mirror_memory_flat():
    """The peak does not grow with the lag: the large lag's peak over its baseline and the small
    one's differ by less than the margin."""
    if SMALL_MB not in _measured or LAG_MB not in _measured:
        pytest.skip("needs both sizes of test_mirror_memory_bound in this run")
    small = _measured[SMALL_MB][1] - _measured[SMALL_MB][0]
    large = _measured[LAG_MB][1] - _measured[LAG_MB][0]
    progress(f"RSS over the baseline: {mb(small)} at {SMALL_MB} MB of lag, {mb(large)} at "
             f"{LAG_MB} MB (margin {mb(MARGIN)})")
    assert abs(large - small) < MARGIN, (f"RSS over the baseline {mb(large)} at {LAG_MB} MB of lag,"
                                         f" {mb(small)} at {SMALL_MB} MB: grows with the lag")
