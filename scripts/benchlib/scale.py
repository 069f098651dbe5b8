"""The scale section: kmirrord mirroring many small topics (10,000 partitions; quick 1,000): catch-up
time, RSS and CPU at idle and under a steady load, next to the destination broker's own CPU."""

import gc
import json
import os
import struct
import subprocess
import threading
import time
import urllib.request

from benchlib import common

TITLE = "Scale: 10,000 mirrored partitions"

KIB = 1024
MIB = 1 << 20
GIB = 1 << 30
RSS_GOAL_MB = 200
PREFIX = "scale-"
# Brokers holding 10,000 partitions (20,000 with the destination's): the harness's 512 MB heap is
# short of that, and topic creation is a controller round per batch.
BROKER_JVM = ["-Xms512m", "-Xmx2g", "-XX:+UseParallelGC", "-XX:-UsePerfData",
              "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"]
BROKER_OVERRIDES = {
    # A partition's segment preallocates 10 MB of offset index and time index (sparse, mmapped):
    # small indexes keep 20,000 of them cheap on the test bed's file system.
    "log.index.size.max.bytes": 1 * MIB,
}


# MirrorMaker 2 at the same scale, after kmirror: connect-mirror as in the other sections, into a
# destination of its own, with these tasks (a worker's threads: more than the 2 cores would not help).
MM2_VERSION = "4.3.1"
MM2_TASKS = 4


def sizes(quick):
    if quick:
        return {"topics": 100, "partitions": 10, "records": 20, "idle_s": 10, "load_s": 10, "load_mb_s": 5,
                "mm2": True}
    return {"topics": 1000, "partitions": 10, "records": 20, "idle_s": 30, "load_s": 30, "load_mb_s": 5,
            "mm2": True}


# -- bulk end offsets ------------------------------------------------------------------------------

class EndOffsets:
    """High watermarks of many partitions in one ListOffsets request (v1, latest) on one connection,
    per-partition errors as -1 (a topic not there yet). The section's clusters have one broker, so
    the bootstrap connection reaches every partition's leader (through kmirrord too). A raw request
    because the admin client's list_offsets cost about 0.7 s of Python per poll of 10,000
    partitions, the same through kmirrord and directly, which hid the lag it was to measure; this
    poll costs 0.03 to 0.1 s either way."""

    def __init__(self, bootstrap):
        self.bootstrap = bootstrap
        self.sock = None
        self.corr = 0

    def _connect(self, timeout):
        import socket
        host, port = self.bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"{self.bootstrap} closed the connection")
            buf += chunk
        return bytes(buf)

    def _ask(self, req, timeout):
        if self.sock is None:
            self._connect(timeout)
        self.sock.settimeout(timeout)
        self.sock.sendall(struct.pack(">i", len(req)) + req)
        n, = struct.unpack(">i", self._recv(4))
        return self._recv(n)

    def latest(self, tps, timeout=60):
        by_topic = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        self.corr += 1
        parts = [struct.pack(">hhi", 2, 1, self.corr), _str16("bench-end-offsets"),
                 struct.pack(">ii", -1, len(by_topic))]  # ListOffsets v1: replica -1, topics
        for t, ps in by_topic.items():
            parts += [_str16(t), struct.pack(">i", len(ps))]
            parts += [struct.pack(">iq", p, -1) for p in ps]  # partition, timestamp latest
        try:
            d = self._ask(b"".join(parts), timeout)
        except OSError:
            # One retry on a new connection (a broker restart, an idle connection closed).
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            d = self._ask(b"".join(parts), timeout)
        got, pos = {}, 4  # past the correlation id
        n_topics, = struct.unpack_from(">i", d, pos)
        pos += 4
        for _ in range(n_topics):
            ln, = struct.unpack_from(">h", d, pos)
            topic = d[pos + 2:pos + 2 + ln].decode()
            pos += 2 + ln
            n_parts, = struct.unpack_from(">i", d, pos)
            pos += 4
            for _ in range(n_parts):
                p, err, _ts, off = struct.unpack_from(">ihqq", d, pos)
                pos += 22
                got[(topic, p)] = off if err == 0 else -1
        return {k: got.get(k, -1) for k in tps}


def _str16(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


DRAIN_POLL_S = 0.05  # the pause between two polls of every end offset after the load


def drain(dst_off, want, load_end, limit, what, trace=None):
    """Polls every destination end offset (through kmirrord, or MirrorMaker's destination directly)
    until each equals want's, the same way for both: returns the lag (load_end to the end of the
    poll that saw the last record) and the longest poll, which bounds how much of the lag is the
    measuring itself. trace: a list that gets each poll's (end s after load_end, seconds, partitions
    behind). what(done, total) -> the error raised after limit seconds."""
    longest = 0.0
    while True:
        t = time.monotonic()
        hw = dst_off.latest(want)
        now = time.monotonic()
        longest = max(longest, now - t)
        done = sum(1 for k in want if hw[k] == want[k])
        if trace is not None:
            trace.append((round(now - load_end, 3), round(now - t, 3), len(want) - done))
        if done == len(want):
            return now - load_end, longest
        if now - load_end > limit:
            raise RuntimeError(what(done, len(want)))
        time.sleep(DRAIN_POLL_S)


def create_topics(bootstrap, names, partitions, batch=100):
    """CreateTopics in batches of batch topics (not one CLI JVM per topic)."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 60000})
    for i in range(0, len(names), batch):
        futs = admin.create_topics([NewTopic(n, partitions, 1) for n in names[i:i + batch]],
                                   operation_timeout=120, request_timeout=180)
        for f in futs.values():
            f.result()


def payload_values():
    os.makedirs(os.path.join(common.REPO, ".cache"), exist_ok=True)
    path = common.bm.make_payload(os.path.join(common.REPO, ".cache", "bench-mirror-payload.txt"))
    with open(path, "rb") as fh:
        return [ln.rstrip(b"\n") for ln in fh][:1000]


def producer(bootstrap):
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                     "batch.size": 65536, "compression.type": "none",
                     "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576})


def produce_each(bootstrap, tps, records, values):
    """records records of 1 KiB into every partition; returns (records, seconds)."""
    p = producer(bootstrap)
    t0, n = time.monotonic(), 0
    errs = []

    def cb(err, _msg):
        if err:
            errs.append(err)
    for t, part in tps:
        for _ in range(records):
            while True:
                try:
                    p.produce(t, values[n % len(values)], partition=part, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
        p.poll(0)
    if p.flush(300):
        raise RuntimeError("scale: the producer could not flush the initial data")
    if errs:
        raise RuntimeError(f"scale: {len(errs)} records failed, the first: {errs[0]}")
    return n, time.monotonic() - t0


def produce_steady(bootstrap, tps, mb_s, seconds, values):
    """mb_s MiB/s of 1 KiB records spread round-robin over every partition for seconds (paced per
    10 ms tick); returns what it did."""
    p = producer(bootstrap)
    rate = mb_s * MIB / KIB
    errs = []

    def cb(err, _msg):
        if err:
            errs.append(err)
    t0 = time.monotonic()
    n = 0
    while True:
        now = time.monotonic() - t0
        if now >= seconds:
            break
        due = min(int(rate * now) + 1, int(rate * seconds))
        while n < due:
            t, part = tps[n % len(tps)]
            try:
                p.produce(t, values[n % len(values)], partition=part, on_delivery=cb)
            except BufferError:
                p.poll(0.01)
                continue
            n += 1
        p.poll(0)
        time.sleep(0.01)
    t_prod = time.monotonic() - t0
    left = p.flush(300)
    t_flush = time.monotonic() - t0
    if left or errs:
        raise RuntimeError(f"scale: steady load: {left} records unflushed, {len(errs)} failed "
                           f"({errs[:1]})")
    return {"records": n, "bytes": n * KIB, "produce_s": t_prod, "flushed_s": t_flush,
            "mb_s": n * KIB / MIB / t_prod}


def mm2_phase(ctx, src, tps, sz, values):
    """MirrorMaker 2 mirroring the same source topics into a destination of its own: its catch-up of
    everything the source holds (its JVM's start and the topics' creation included), then the same
    steady load and the lag after it, its JVM's CPU and the source broker's over those windows."""
    import types
    dst = common.bm.Side("scale-mm2-dst")
    dst.cluster.jvm_opts = list(BROKER_JVM)
    dst.cluster.overrides.update(BROKER_OVERRIDES)
    proc = log = None
    out = {"tasks": MM2_TASKS, "version": MM2_VERSION}
    try:
        dst.start()
        libs = common.mm2.mm2_libs(MM2_VERSION)
        a = types.SimpleNamespace(partitions=MM2_TASKS, codec="none", batch_size=65536, linger_ms=5)
        props = common.mm2.mm2_properties(src.bootstrap, dst.bootstrap, f"{PREFIX}.*", a)
        out["properties"] = props
        cfg = os.path.join(dst.cluster.base_dir, "mm2-scale.properties")
        with open(cfg, "w") as fh:
            fh.write(props)
        src_off, dst_off = EndOffsets(src.bootstrap), EndOffsets(dst.bootstrap)
        want = src_off.latest(tps)
        cmd = common.mm2.mm2_command(libs, cfg)
        ctx.command("scale", "MirrorMaker 2 (configuration below)", cmd)
        log = open(os.path.join(ctx.out, "mm2-bench-scale.log"), "w")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        pids = {"mm2": proc.pid, "src": src.cluster.nodes[1].pid, "dst": dst.cluster.nodes[1].pid}

        def cpu():
            return {k: common.bp.proc_cpu_seconds(p) for k, p in pids.items()}

        def wait_for(target, limit, what):
            first = None
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"scale: MirrorMaker 2 exited {proc.returncode} (log {log.name})")
                hw = dst_off.latest(tps)
                done = sum(1 for k in tps if hw[k] == target[k])
                if first is None and any(v > 0 for v in hw.values()):
                    first = time.monotonic()
                if done == len(tps):
                    return first
                if time.monotonic() - t0 > limit:
                    raise RuntimeError(f"scale: MirrorMaker 2 {what}: {done} of {len(tps)} partitions in {limit} s")
                time.sleep(0.5)
        c0 = cpu()
        first = wait_for(want, 1800, "catch-up")
        t1, c1 = time.monotonic(), cpu()
        out["catchup"] = {"seconds": t1 - t0, "first_record_s": first - t0 if first else None,
                          "records": sum(want.values()), "mm2_cpu_s": c1["mm2"] - c0["mm2"]}
        ctx.log("scale", f"MirrorMaker 2 caught up in {t1 - t0:.1f} s")
        time.sleep(sz["idle_s"])
        c2, t2 = cpu(), time.monotonic()
        load = produce_steady(src.bootstrap, tps, sz["load_mb_s"], sz["load_s"], values)
        t3 = time.monotonic()
        load["drain_polls"] = []
        load["lag_s"], load["drain_poll_max_s"] = drain(
            dst_off, src_off.latest(tps), t3, 600,
            lambda done, total: f"scale: MirrorMaker 2 after the steady load: {done} of {total} partitions in 600 s",
            load["drain_polls"])
        t4, c4 = time.monotonic(), cpu()
        load["seconds"] = t4 - t2
        for k in pids:
            load[f"{k}_cpu_s"] = c4[k] - c2[k]
        load["mm2_rss_kib"] = common.bp.proc_rss_kib(proc.pid)
        out["load"] = load
        ctx.log("scale", f"MirrorMaker 2: steady load {load['mb_s']:.1f} MiB/s, lag at the end {load['lag_s']:.1f} s")
        return out
    finally:
        src_off = dst_off = None
        gc.collect()
        if proc is not None:
            common.mm2.mm2_stop(proc)
        if log:
            log.close()
        dst.stop()


# -- sampling --------------------------------------------------------------------------------------

class Sampler(threading.Thread):
    """Every second: kmirrord's RSS and CPU seconds, the destination broker's CPU seconds and RSS,
    the source broker's CPU seconds, with the phase under way."""

    def __init__(self, pids, t0):
        super().__init__(daemon=True)
        self.pids, self.t0 = pids, t0
        self.phase = "setup"
        self.rows = []
        self.stop_ev = threading.Event()

    def sample(self):
        row = {"t": round(time.monotonic() - self.t0, 3), "phase": self.phase}
        for name, pid in self.pids.items():
            try:
                row[f"{name}_cpu"] = common.bp.proc_cpu_seconds(pid)
                row[f"{name}_rss_kib"] = common.bp.proc_rss_kib(pid)
            except OSError:
                pass
        self.rows.append(row)
        return row

    def run(self):
        while not self.stop_ev.wait(1.0 - (time.monotonic() - self.t0) % 1.0):
            self.sample()


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as fh:
        for ln in fh:
            if ln.startswith(key + ":"):
                return int(ln.split()[1])
    return 0


def scrape(url):
    """The sums of the /metrics families the section reports (None without an endpoint)."""
    want = ("kmirror_mirror_fetch_requests_total", "kmirror_requests_total", "kmirror_mirror_records_total",
            "kmirror_mirror_bytes_total", "kmirror_mirror_errors_total", "kmirror_state_writes_total",
            "kmirror_upstream_bytes_in_total", "kmirror_upstream_bytes_out_total")
    out = {k: 0.0 for k in want}
    out["fetch_full"] = out["fetch_incremental"] = 0.0
    out["partitions_mirroring"] = 0.0
    t = time.monotonic()
    with urllib.request.urlopen(url, timeout=60) as r:
        text = r.read().decode()
    for ln in text.splitlines():
        if ln.startswith("#") or not ln:
            continue
        name = ln.split("{", 1)[0].split(" ", 1)[0]
        try:
            v = float(ln.rsplit(" ", 1)[1])
        except ValueError:
            continue
        if name in out:
            out[name] += v
        if name == "kmirror_mirror_fetch_requests_total":
            out["fetch_full" if 'kind="full"' in ln else "fetch_incremental"] += v
        if name == "kmirror_state_partitions" and 'state="MIRRORING"' in ln:
            out["partitions_mirroring"] += v
    out["bytes"] = len(text)
    out["scrape_s"] = time.monotonic() - t
    return out


LOG_EVENTS = {
    "source Fetch failed": "Fetch from source broker",
    "source Metadata failed": "source Metadata failed",
    "requests timed out": "timed out\"",
    "partitions reconciling": "reconciling",
    "ListOffsets NOT_LEADER_OR_FOLLOWER": "failed: NOT_LEADER_OR_FOLLOWER",
}


def log_counts(path):
    """How often kmirrord's log (info) names what slows a mirror down."""
    out = {k: 0 for k in LOG_EVENTS}
    try:
        with open(path, errors="replace") as fh:
            for ln in fh:
                for k, needle in LOG_EVENTS.items():
                    if needle in ln:
                        out[k] += 1
    except OSError:
        pass
    return out


def window(samples, name, a, b):
    """(CPU seconds, seconds) of process name between times a and b, from the samples."""
    rows = [r for r in samples if a <= r["t"] <= b and f"{name}_cpu" in r]
    if len(rows) < 2:
        return None, None
    return rows[-1][f"{name}_cpu"] - rows[0][f"{name}_cpu"], rows[-1]["t"] - rows[0]["t"]


# -- the run ---------------------------------------------------------------------------------------

def run(ctx):
    sz = sizes(ctx.quick)
    n_topics, n_parts = sz["topics"], sz["partitions"]
    total = n_topics * n_parts
    topics = [f"{PREFIX}{i:04d}" for i in range(n_topics)]
    tps = [(t, p) for t in topics for p in range(n_parts)]
    values = payload_values()
    res = {"sizes": sz, "partitions": total, "broker_jvm": BROKER_JVM, "broker_overrides": BROKER_OVERRIDES}
    src, dst = common.bm.Side("scale-src"), common.bm.Side("scale-dst")
    for side in (src, dst):
        side.cluster.jvm_opts = list(BROKER_JVM)
        side.cluster.overrides.update(BROKER_OVERRIDES)
    proxy = sampler = src_off = dst_off = None
    try:
        t = time.monotonic()
        src.start()
        dst.start()
        ctx.log("scale", f"clusters up in {time.monotonic() - t:.0f} s")
        from harness import free_port
        http = f"127.0.0.1:{free_port()}"
        # info: the reasons partitions reconcile are logged at info; the log stays with the results.
        opts = [f"http-listen={http}", "log-level=info"]
        proxy, proxy_bs = common.bp.start_proxy(ctx.kmirrord, dst.cluster, ctx.out, opts, "scale")
        res["kmirrord_log"] = os.path.basename(proxy.log_path)
        metrics_url = f"http://{http}/metrics"
        ctx.command("scale", "kmirrord", [ctx.kmirrord, "--listen", proxy_bs, "--upstream", dst.bootstrap,
                                          "--log-level", "warn"] + [f"--{o}" for o in opts])
        cli = common.bm.Cli(ctx.kmirror, proxy_bs)
        common.bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 60, "kmirrord to answer")
        pids = {"kmirrord": proxy.pid, "dst": dst.cluster.nodes[1].pid, "src": src.cluster.nodes[1].pid}
        t_base = time.monotonic()
        sampler = Sampler(pids, t_base)
        sampler.start()

        def now():
            return time.monotonic() - t_base
        marks = {}

        # 1. the source topics and a little data in every partition
        sampler.phase = "setup"
        t = time.monotonic()
        create_topics(src.bootstrap, topics, n_parts)
        src_off = EndOffsets(src.bootstrap)
        while min(src_off.latest(tps).values()) < 0:  # every leader elected (1 s between polls of 10,000)
            if time.monotonic() - t > 600:
                raise RuntimeError("scale: the source's leaders were not all elected in 600 s")
            time.sleep(1)
        res["create_s"] = time.monotonic() - t
        ctx.log("scale", f"{n_topics} topics x {n_parts} partitions created in {res['create_s']:.1f} s")
        ctx.command("scale", "source topics", ["AdminClient.create_topics", f"{n_topics} x NewTopic({PREFIX}NNNN, "
                    f"{n_parts}, 1)", "in batches of 100"])
        n, secs = produce_each(src.bootstrap, tps, sz["records"], values)
        want = src_off.latest(tps)
        res["initial"] = {"records": n, "bytes": n * KIB, "produce_s": secs,
                          "complete": all(v == sz["records"] for v in want.values())}
        ctx.command("scale", "initial data", ["confluent_kafka.Producer", "acks=all", "linger.ms=20",
                    "batch.size=65536", f"{sz['records']} x 1 KiB per partition"])
        ctx.log("scale", f"{n} records produced in {secs:.1f} s")

        # 2. catch-up: create + start, until every destination high watermark is the source's
        dst_off = EndOffsets(proxy_bs)
        cli.run("create", "--mirror", "scale", "--source-bootstrap", src.bootstrap)
        ctx.command("scale", "create", [ctx.kmirror, "--bootstrap-server", proxy_bs, "create", "--mirror",
                                        "scale", "--source-bootstrap", src.bootstrap])
        m0 = scrape(metrics_url)
        sampler.phase = "catch-up"
        marks["catchup_start"] = now()
        # --topics-regex matches the destination's topics (none yet): the names, in one request.
        # kmirrord bounds a start's topic creation by 15 s; topics whose destination leaders were
        # not all elected by then are refused REQUEST_TIMED_OUT and started again, as an operator
        # would (they exist on the destination now, so the second start only reads them).
        starts, ask = [], list(topics)
        while ask:
            t_s = now()
            # The store takes the topics in turn with the partitions' own transitions: minutes, not
            # the CLI's default 30 s, at 10,000 partitions on a loaded destination.
            r = subprocess.run([ctx.kmirror, "--bootstrap-server", proxy_bs, "--timeout-ms", "600000", "start",
                                "--mirror", "scale", "--topics", ",".join(ask)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
            refused, msgs = {}, {}
            for ln in r.stdout.splitlines():
                f = ln.split(None, 2)
                if len(f) >= 2 and f[0].startswith(PREFIX) and f[1].isupper():  # an error name, not "started"
                    refused[f[0]] = f[1]
                    msgs.setdefault(f[1], f[2] if len(f) > 2 else "")
            starts.append({"topics": len(ask), "refused": len(refused), "seconds": now() - t_s,
                           "errors": sorted(set(refused.values())), "messages": msgs})
            ctx.log("scale", f"start of {len(ask)} topics: {len(refused)} refused in {now() - t_s:.1f} s {msgs}")
            if r.returncode != 0 and not refused:
                raise RuntimeError(f"scale: kmirror start exited {r.returncode}: {r.stderr[-2000:]}")
            if any(e != "REQUEST_TIMED_OUT" for e in refused.values()) or len(starts) >= 20:
                raise RuntimeError(f"scale: kmirror start refused {len(refused)} topics: "
                                   f"{sorted(set(refused.values()))}: {r.stdout[-1500:]}")
            ask = sorted(refused)
        marks["start_answered"] = now()
        ctx.command("scale", "start", [ctx.kmirror, "--bootstrap-server", proxy_bs, "--timeout-ms", 600000, "start",
                                       "--mirror", "scale",
                                       "--topics", f"{topics[0]},...,{topics[-1]}"])
        progress = []
        last_change, last_done = now(), -1
        while True:
            hw = dst_off.latest(tps)
            exists = sum(1 for v in hw.values() if v >= 0)
            done = sum(1 for k, v in hw.items() if v == want[k])
            progress.append((round(now(), 3), exists, done))
            if len(progress) % 60 == 0:
                ctx.log("scale", f"catch-up: {exists} partitions visible, {done} caught up")
            if done == total:
                break
            if done != last_done:
                last_change, last_done = now(), done
            elif now() - last_change > 300:
                raise RuntimeError(f"scale: catch-up stalled at {done} of {total} partitions")
            time.sleep(0.5)
        marks["catchup_end"] = now()
        m1 = scrape(metrics_url)
        res["catchup"] = {"seconds": marks["catchup_end"] - marks["catchup_start"],
                          "start_rpc_s": marks["start_answered"] - marks["catchup_start"],
                          "starts": starts, "polls": len(progress), "progress": progress,
                          "first_all_exist_s": next((p[0] - marks["catchup_start"] for p in progress
                                                     if p[1] == total), None)}
        res["catchup"]["kmirrord_hwm_kib"] = proc_status(proxy.pid, "VmHWM")
        ctx.log("scale", f"caught up in {res['catchup']['seconds']:.1f} s ({len(progress)} polls)")

        # 3. idle: nothing produced, nothing polled
        sampler.phase = "idle"
        marks["idle_start"] = now()
        time.sleep(sz["idle_s"])
        marks["idle_end"] = now()
        m2 = scrape(metrics_url)

        # 4. steady load over every partition, then the time until the last record is visible
        common.bm.reset_hwm(proxy.pid)
        sampler.phase = "load"
        marks["load_start"] = now()
        load = produce_steady(src.bootstrap, tps, sz["load_mb_s"], sz["load_s"], values)
        marks["load_end"] = now()
        ctx.command("scale", "steady load", ["confluent_kafka.Producer", "acks=all", "linger.ms=20",
                    f"{sz['load_mb_s']} MiB/s of 1 KiB records round-robin over all partitions",
                    f"{sz['load_s']} s"])
        sampler.phase = "drain"
        load["drain_polls"] = []
        load["lag_s"], load["drain_poll_max_s"] = drain(
            dst_off, src_off.latest(tps), t_base + marks["load_end"], 300,
            lambda done, total: f"scale: the mirror did not catch up after the steady load: {done} of {total} "
                                f"partitions in 300 s", load["drain_polls"])
        marks["drain_end"] = now()
        load["kmirrord_hwm_kib"] = proc_status(proxy.pid, "VmHWM")
        # The load's metrics are scraped after the drain only: kmirrord renders the page of 10,000
        # partitions' series on its event loop, which MirrorMaker 2's lag has no counterpart of.
        m4 = scrape(metrics_url)
        sampler.phase = "end"
        time.sleep(1.5)
        sampler.stop_ev.set()
        sampler.join(5)
        res["load"] = load
        res["marks"] = marks
        res["metrics"] = {"before_start": m0, "caught_up": m1, "idle_end": m2, "drained": m4}
        res["samples"] = sampler.rows
        res["kmirrord_rss_end_kib"] = common.bp.proc_rss_kib(proxy.pid)
        res["describe_head"] = cli.run("describe", "--mirror", "scale", check=False).stdout[:400]
        res["log_counts"] = log_counts(proxy.log_path)
        ctx.log("scale", f"steady load {load['mb_s']:.1f} MiB/s, lag at the end {load['lag_s']:.1f} s; "
                f"kmirrord's log: {res['log_counts']}")
        if sz.get("mm2"):
            # The peer at the same scale, alone: kmirrord stopped, the same source and load.
            src_off = dst_off = None
            gc.collect()
            proxy.stop(timeout=60)
            proxy = None
            res["mm2"] = mm2_phase(ctx, src, tps, sz, values)
        derive(res)
        return res
    finally:
        # librdkafka clients closed before the brokers and the proxy go (no reconnect noise).
        src_off = dst_off = None
        gc.collect()
        if sampler:
            sampler.stop_ev.set()
        if proxy:
            proxy.stop(timeout=60)
        dst.stop()
        src.stop()


def derive(res):
    """The figures from the raw samples (kept in res, so the report re-renders from it alone)."""
    s, mk, met = res["samples"], res["marks"], res["metrics"]
    fig = {}
    for ph, a, b in (("catchup", "catchup_start", "catchup_end"), ("idle", "idle_start", "idle_end"),
                     ("load", "load_start", "drain_end")):
        for proc in ("kmirrord", "dst", "src"):
            cpu, secs = window(s, proc, mk[a], mk[b])
            fig[f"{ph}_{proc}_cpu_s"] = cpu
            fig[f"{ph}_{proc}_cpu_per_s"] = cpu / secs if cpu is not None and secs else None
        rss = [r["kmirrord_rss_kib"] for r in s if mk[a] <= r["t"] <= mk[b] and "kmirrord_rss_kib" in r]
        fig[f"{ph}_kmirrord_rss_max_mb"] = max(rss) / 1024 if rss else None
        fig[f"{ph}_kmirrord_rss_last_mb"] = rss[-1] / 1024 if rss else None
    idle_s = mk["idle_end"] - mk["idle_start"]
    fig["idle_fetch_per_s"] = (met["idle_end"]["kmirror_mirror_fetch_requests_total"] -
                               met["caught_up"]["kmirror_mirror_fetch_requests_total"]) / idle_s
    fig["idle_requests_per_s"] = (met["idle_end"]["kmirror_requests_total"] -
                                  met["caught_up"]["kmirror_requests_total"]) / idle_s
    load_s = mk["drain_end"] - mk["load_start"]
    fig["load_fetch_per_s"] = (met["drained"]["kmirror_mirror_fetch_requests_total"] -
                               met["idle_end"]["kmirror_mirror_fetch_requests_total"]) / load_s
    fig["load_records_mirrored"] = (met["drained"]["kmirror_mirror_records_total"] -
                                    met["idle_end"]["kmirror_mirror_records_total"])
    fig["load_full_fetches"] = met["drained"]["fetch_full"] - met["idle_end"]["fetch_full"]
    fig["load_errors"] = (met["drained"]["kmirror_mirror_errors_total"] -
                          met["idle_end"]["kmirror_mirror_errors_total"])
    gb = res["load"]["bytes"] / GIB
    for proc in ("kmirrord", "dst", "src"):
        c = fig[f"load_{proc}_cpu_s"]
        fig[f"load_{proc}_cpu_per_gb"] = c / gb if c is not None else None
    ib = res["initial"]["bytes"] / GIB
    fig["catchup_kmirrord_cpu_per_gb"] = fig["catchup_kmirrord_cpu_s"] / ib if fig["catchup_kmirrord_cpu_s"] else None
    fig["peak_rss_mb"] = max(r.get("kmirrord_rss_kib", 0) for r in s) / 1024
    res["fig"] = fig


# -- the report ------------------------------------------------------------------------------------

def _f(x, nd=2):
    return "?" if x is None else f"{x:,.{nd}f}"


def plot(res, ctx):
    plt = common.pyplot()
    s, mk = res["samples"], res["marks"]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
    ts = [r["t"] for r in s]
    ax1.plot(ts, [r.get("kmirrord_rss_kib", 0) / 1024 for r in s], label="kmirrord RSS")
    ax1.axhline(RSS_GOAL_MB, color="red", linestyle="--", linewidth=0.8, label=f"goal {RSS_GOAL_MB} MB")
    ax1.set_ylabel("MB")
    ax1.set_title(f"kmirrord mirroring {res['partitions']:,} partitions: RSS and CPU, sampled every second")
    ax1.legend(loc="upper left", fontsize=8)
    for proc, label in (("kmirrord", "kmirrord"), ("dst", "destination broker"), ("src", "source broker")):
        xs, ys = [], []
        for a, b in zip(s, s[1:]):
            if f"{proc}_cpu" in a and f"{proc}_cpu" in b and b["t"] > a["t"]:
                xs.append(b["t"])
                ys.append(100 * (b[f"{proc}_cpu"] - a[f"{proc}_cpu"]) / (b["t"] - a["t"]))
        ax2.plot(xs, ys, label=label, linewidth=1)
    ax2.set_ylabel("CPU % of one core")
    ax2.legend(loc="upper left", fontsize=8)
    pr = res["catchup"]["progress"]
    ax3.plot([p[0] for p in pr], [p[1] for p in pr], label="destination partitions existing (through the proxy)")
    ax3.plot([p[0] for p in pr], [p[2] for p in pr], label="partitions caught up")
    ax3.set_ylabel("partitions")
    ax3.set_xlabel("seconds")
    ax3.legend(loc="lower right", fontsize=8)
    for ax in (ax1, ax2, ax3):
        for name, a, b, c in (("catch-up", "catchup_start", "catchup_end", "#e0f0ff"),
                              ("idle", "idle_start", "idle_end", "#f0f0f0"),
                              ("load", "load_start", "load_end", "#fff0e0"),
                              ("drain", "load_end", "drain_end", "#ffe0e0")):
            ax.axvspan(mk[a], mk[b], color=c, zorder=0)
    for name, a in (("catch-up", "catchup_start"), ("idle", "idle_start"), ("load", "load_start")):
        ax1.text(mk[a], ax1.get_ylim()[1] * 0.95, " " + name, fontsize=8, va="top")
    fig.tight_layout()
    fig.savefig(ctx.png("scale-timeline.png"), dpi=110)
    plt.close(fig)


def _mm2_lines(res):
    """kmirror against MirrorMaker 2 at the same scale, when the run measured it."""
    m = res.get("mm2")
    if not m:
        return []
    ld, ml, fg = res["load"], m["load"], res["fig"]
    k_load_s = res["marks"]["drain_end"] - res["marks"]["load_start"]
    gb_k, gb_m = ld["bytes"] / GIB, ml["bytes"] / GIB
    rows = [
        ["catch-up of every partition (s)", _f(res["catchup"]["seconds"], 1), _f(m["catchup"]["seconds"], 1)],
        ["records the catch-up copied", f"{res['initial']['records']:,}", f"{m['catchup']['records']:,}"],
        ["steady load achieved (MiB/s)", _f(ld["mb_s"], 2), _f(ml["mb_s"], 2)],
        ["the load producer's time to have it all acknowledged (s)", _f(ld["flushed_s"], 1), _f(ml["flushed_s"], 1)],
        ["**lag at the end of the load** (last record visible, s)", f"**{_f(ld['lag_s'], 2)}**",
         f"**{_f(ml['lag_s'], 2)}**"],
        ["the longest poll of every end offset while it drained (s; part of the lag is the measuring)",
         _f(ld.get("drain_poll_max_s"), 2), _f(ml.get("drain_poll_max_s"), 2)],
        ["mirror's CPU s per GiB under load (load + drain)", _f(fg["load_kmirrord_cpu_per_gb"], 1),
         _f(ml["mm2_cpu_s"] / gb_m, 1) if gb_m else "?"],
        ["source broker CPU s/s under load (load + drain)", _f(fg["load_src_cpu_per_s"], 3),
         _f(ml["src_cpu_s"] / ml["seconds"], 3) if ml.get("seconds") else "?"],
    ]
    return ["", f"**MirrorMaker 2 at the same scale**, in the same run: after kmirror's phases kmirrord is "
            f"stopped and MirrorMaker 2 {m['version']} (dedicated mode, tasks.max={m['tasks']}, topics "
            f"`{PREFIX}.*`, the configuration below) mirrors the same source topics into a one-broker "
            f"destination of its own (the same broker settings): first everything the source holds by then "
            f"(its JVM's start and its creation of the topics included), then {res['sizes']['idle_s']} s idle "
            f"and the same steady load, timed the same way (kmirror's lag through kmirrord; MirrorMaker's on "
            f"its destination directly).", "",
            common.md_table(["figure", ":kmirror", ":MirrorMaker 2"], rows), "",
            "MirrorMaker 2's configuration:", "", "```properties", m.get("properties", "").rstrip(), "```"]


def report(res, ctx):
    derive(res)  # the figures again from the raw samples: a re-render gets the current ones
    sz, fg, ld, cu = res["sizes"], res["fig"], res["load"], res["catchup"]
    plot(res, ctx)
    peak = fg["peak_rss_mb"]
    goal = "meets" if peak <= RSS_GOAL_MB else "misses"
    lines = [
        f"{sz['topics']:,} source topics × {sz['partitions']} partitions = **{res['partitions']:,} mirrored "
        f"partitions**, one mirror, one broker per cluster (heap {res['broker_jvm'][1]}, "
        f"{', '.join(f'{k}={v}' for k, v in res['broker_overrides'].items())}). The topics are created with "
        f"AdminClient.create_topics in batches of 100 ({_f(res['create_s'], 1)} s), and each partition gets "
        f"{sz['records']} records of 1 KiB ({res['initial']['records']:,} records, "
        f"{res['initial']['bytes'] / MIB:.0f} MiB) from one confluent-kafka producer. Then `kmirror create` and "
        f"`kmirror start --topics {PREFIX}0000,...` (all of them in one StartMirrorTopics; `--topics-regex` matches the destination's topics, and there are none yet); catch-up is the time from start until every destination "
        f"high watermark, read through kmirrord in one ListOffsets per poll across all partitions, equals the "
        f"source's. Idle: {sz['idle_s']} s with nothing produced and nothing polled. Load: "
        f"{sz['load_mb_s']} MiB/s of 1 KiB records round-robin over every partition for {sz['load_s']} s, "
        f"then the time from the producer's flush to the end of the poll that saw every partition's last record "
        f"through the proxy (the lag at the end; polls {DRAIN_POLL_S} s apart, each one ListOffsets v1 request of "
        f"the bench's own on one connection, about 0.05 s for 10,000 partitions). CPU seconds "
        f"are utime+stime from /proc of each process, sampled every second; the peer is the destination "
        f"broker's JVM over the same windows (the source broker's is shown too).",
        "",
        common.md_table(
            ["phase", ":seconds", ":kmirrord CPU s", ":kmirrord CPU s/s", ":dest broker CPU s/s",
             ":kmirrord / dest broker", ":source broker CPU s/s", ":kmirrord RSS max MB"],
            [[ph, _f(secs, 1), _f(fg[f"{k}_kmirrord_cpu_s"]), _f(fg[f"{k}_kmirrord_cpu_per_s"], 4),
              _f(fg[f"{k}_dst_cpu_per_s"], 3),
              _f(fg[f"{k}_kmirrord_cpu_s"] / fg[f"{k}_dst_cpu_s"], 2) if fg[f"{k}_dst_cpu_s"] else "?",
              _f(fg[f"{k}_src_cpu_per_s"], 3), _f(fg[f"{k}_kmirrord_rss_max_mb"], 1)]
             for ph, k, secs in (("catch-up", "catchup", cu["seconds"]),
                                 ("idle", "idle", res["marks"]["idle_end"] - res["marks"]["idle_start"]),
                                 ("load + drain", "load", res["marks"]["drain_end"] - res["marks"]["load_start"]))]),
        "",
        common.md_table(
            ["figure", ":value"],
            [["catch-up of all partitions", f"**{_f(cu['seconds'], 1)} s** (the last start answered after "
              f"{_f(cu['start_rpc_s'], 2)} s; every destination partition visible after "
              f"{_f(cu['first_all_exist_s'], 1)} s; {cu['polls']} polls)"],
             ["kmirror start calls (topics asked / refused REQUEST_TIMED_OUT, seconds)",
              "; ".join(f"{x['topics']} / {x['refused']}, {x['seconds']:.1f} s" for x in cu.get("starts", []))],
             ["kmirrord CPU s per GiB over the catch-up (the partitions' start included)",
              _f(fg["catchup_kmirrord_cpu_per_gb"], 1)],
             ["kmirrord RSS: peak over the whole run / goal", f"**{_f(peak, 1)} MB** / {RSS_GOAL_MB} MB ({goal} it)"],
             ["kmirrord RSS at idle (end of idle)", f"{_f(fg['idle_kmirrord_rss_last_mb'], 1)} MB"],
             ["kmirrord CPU at idle", f"{_f(fg['idle_kmirrord_cpu_per_s'], 4)} s/s "
              f"(destination broker {_f(fg['idle_dst_cpu_per_s'], 4)} s/s)"],
             ["Fetch requests to the source at idle (/metrics)", f"{_f(fg['idle_fetch_per_s'], 1)} /s"],
             ["steady load achieved", f"{_f(ld['mb_s'], 2)} MiB/s, {ld['records']:,} records"],
             ["kmirrord CPU s per GiB mirrored under load", f"**{_f(fg['load_kmirrord_cpu_per_gb'], 1)}** "
              f"(destination broker {_f(fg['load_dst_cpu_per_gb'], 1)}, ratio "
              f"{_f(fg['load_kmirrord_cpu_s'] / fg['load_dst_cpu_s'], 2) if fg['load_dst_cpu_s'] else '?'})"],
             ["Fetch requests to the source under load (/metrics)", f"{_f(fg['load_fetch_per_s'], 1)} /s"],
             ["full Fetches (a fetch session opened or restarted) / partition errors, load + drain (/metrics)",
              f"{_f(fg.get('load_full_fetches'), 0)} / {_f(fg.get('load_errors'), 0)}"],
             ["kmirrord peak RSS under load (VmHWM)", f"{_f(ld['kmirrord_hwm_kib'] / 1024, 1)} MB"],
             ["lag at the end of the load (last record visible)", f"**{_f(ld['lag_s'], 2)} s**"]]),
        "",
        f"![kmirrord RSS and CPU over the phases, {res['partitions']:,} partitions](scale-timeline.png)",
        "",
    ]
    if peak > RSS_GOAL_MB:
        lines.append(f"The goal of {RSS_GOAL_MB} MB RSS at 10,000 partitions is missed: peak {peak:.1f} MB.")
    else:
        lines.append(f"The goal of {RSS_GOAL_MB} MB RSS at 10,000 partitions is met"
                     f"{' (at the quick size, ' + format(res['partitions'], ',') + ' partitions)' if sz['topics'] < 1000 else ''}: "
                     f"peak {peak:.1f} MB.")
    lc = res.get("log_counts")
    if not lc and res.get("kmirrord_log"):  # a run before the counts were kept: its log is there
        lc = log_counts(os.path.join(ctx.out, res["kmirrord_log"]))
    if lc:
        lines += ["", "kmirrord's log over the run (`--log-level info`, kept as "
                  f"`{res.get('kmirrord_log', 'kmirrord-bench-scale.log')}` next to the results): "
                  + ", ".join(f"{k} {v:,}" for k, v in lc.items()) + "."]
    lines += ["", f"Where the time goes. kmirrord's own CPU stays small in every phase "
              f"({_f(fg['catchup_kmirrord_cpu_per_s'], 3)}, {_f(fg['idle_kmirrord_cpu_per_s'], 4)} and "
              f"{_f(fg['load_kmirrord_cpu_per_s'], 3)} CPU s/s); the brokers set the pace. The catch-up is "
              f"mostly the destination bringing {res['partitions']:,} new partitions online (the topics are "
              f"created in requests of at most 5,000 controller records; a start waits 15 s at most for their "
              f"leaders and answers REQUEST_TIMED_OUT for the topics still without, which the section starts "
              f"again), then one ListOffsets per partition on each side (reconcile and start position). "
              f"Under load, {sz['load_mb_s']} MiB/s spread over {res['partitions']:,} partitions is one record "
              f"per partition every {res['partitions'] * KIB / (sz['load_mb_s'] * MIB):.1f} s: every record "
              f"is a batch of its own, for the source broker to append and serve; its producer needed "
              f"{_f(ld['flushed_s'], 0)} s to have {sz['load_s']} s of records acknowledged"
              + (f"; {lc['source Fetch failed']} Fetch(es) to it waited over kmirrord's 31 s request timeout, "
                 f"and each such failure ends the fetch session: 31 s without fetching, then a full Fetch of every "
                 f"partition." if lc and lc.get("source Fetch failed") else ".")]
    lines += _mm2_lines(res)
    notes = res.get("notes")
    if notes:
        lines += ["", notes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(sizes(False)))
