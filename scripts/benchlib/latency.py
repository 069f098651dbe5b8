"""The latency section of scripts/bench: replication latency under steady load, kmirror against
MirrorMaker 2, from the source produce to visible to a consumer on the destination side."""

import hashlib
import os
import shutil
import subprocess
import threading
import time
import types

from benchlib import common

TITLE = "Replication latency under steady load (kmirror against MirrorMaker 2)"
SECTION = "latency"
PARTITIONS = 8
RECORD = 1024
CODEC = "lz4"
LINGER_MS = 5
BATCH_SIZE = 65536
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "LatencyProbe.java")
# The probe measures latency: G1 (short pauses) and a heap fixed up front, so neither the JVM's
# collector choice nor heap growth lands in one system's tail and not the other's.
PROBE_JVM = ["-Xms768m", "-Xmx768m", "-XX:+UseG1GC", "-XX:-UsePerfData", "-Djava.awt.headless=true"]


def _sizes(quick):
    if quick:
        return {"rates": [1, 10], "warmup_s": 5, "measure_s": 20, "drain_s": 60, "rounds": 1}
    return {"rates": [1, 10, 50], "warmup_s": 15, "measure_s": 60, "drain_s": 120, "rounds": 3}


def _javac():
    from harness.kafka_cluster import java_bin
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    if not javac:
        raise RuntimeError("latency: javac not found (the probe is Java)")
    return javac


def probe_classes(cluster):
    """LatencyProbe compiled against the harness's Kafka jars, once per source and Kafka version,
    into .cache/latency-probe/."""
    with open(PROBE, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:12]
    ver = ".".join(map(str, cluster.version))
    out = os.path.join(common.REPO, ".cache", "latency-probe", f"{digest}-{ver}")
    if not os.path.exists(os.path.join(out, "LatencyProbe.class")):
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        subprocess.run([_javac(), "-d", tmp, "-cp", os.path.join(cluster.libs, "*"), PROBE],
                       check=True, timeout=300)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def _kv(line):
    out = {}
    for tok in line.split()[1:]:
        k, v = tok.split("=", 1)
        out[k] = float(v) if any(c in v for c in ".eE") or v.startswith("-") else int(v)
    return out


def run_probe(ctx, cluster, classes, label, produce, consume, topic, rate, sz, payload, pid, extra=()):
    """One probe run at rate MiB/s: its RESULT line as a dict, plus the CPU seconds of pid (the
    mirroring process) from the measured window's start to its last record seen."""
    from harness.kafka_cluster import java_bin
    args = [f"produce={produce}", f"consume={consume}", f"topic={topic}", f"partitions={PARTITIONS}",
            f"rate={rate}", f"size={RECORD}", f"warmup={sz['warmup_s']}", f"measure={sz['measure_s']}",
            f"drain={sz.get('drain_s', 60)}", f"payload={payload}", f"producer.compression.type={CODEC}",
            f"producer.linger.ms={LINGER_MS}", f"producer.batch.size={BATCH_SIZE}", *extra]
    cmd = [java_bin(), *PROBE_JVM, "-Dlog4j2.configurationFile=" + cluster._tool_log4j(),
           "-cp", os.pathsep.join([classes, os.path.join(cluster.libs, "*")]), "LatencyProbe", *args]
    ctx.command(SECTION, f"probe, {label} at {rate} MB/s", cmd)
    errpath = os.path.join(cluster.base_dir, f"probe-{label}-{rate}.err")
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]  # the machine is shared: its load next to each run's figures
    res, cfg, cpu0, t0, dup_examples, slowest = None, {}, None, None, [], []
    with open(errpath, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        killer = threading.Timer(sz["warmup_s"] + sz["measure_s"] + sz.get("drain_s", 60) + 180, proc.kill)
        killer.start()
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if line.startswith("CONFIG "):
                    _, who, text = line.split(" ", 2)
                    cfg[who] = text
                elif line == "MEASURE":
                    cpu0, t0 = common.bp.proc_cpu_seconds(pid), time.monotonic()
                elif line == "DRAINED" and cpu0 is not None:
                    cpu1, t1 = common.bp.proc_cpu_seconds(pid), time.monotonic()
                elif line.startswith("DUP "):
                    dup_examples.append(line[4:])
                elif line.startswith("SLOW "):
                    slowest.append(_kv(line))
                elif line.startswith("RESULT "):
                    res = _kv(line)
            proc.wait(60)
        finally:
            killer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if res is None or cpu0 is None:
        with open(errpath) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"latency: the probe ({label}, {rate} MB/s) exited {proc.returncode} "
                           f"without a result:\n{tail}")
    res.update({"system": label, "target_mb_s": rate, "cpu_s": cpu1 - cpu0, "window_s": t1 - t0,
                "loadavg": load, "dup_examples": dup_examples, "slowest": slowest})
    return res, cfg


def _markers(bootstrap, topic):
    """One short record per partition: once each has crossed, the mirror runs on every partition."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for part in range(PARTITIONS):
        p.produce(topic, b"marker", partition=part)
    if p.flush(60) != 0:
        raise RuntimeError("latency: markers not acknowledged")


def _caught_up(bootstrap, src, topic, timeout, what, alive=lambda: True):
    want = common.bm.high_watermarks(src.bootstrap, topic, PARTITIONS)
    t0 = time.monotonic()
    while True:
        if not alive():
            raise RuntimeError(f"latency: {what} exited while starting")
        try:
            if common.bm.high_watermarks(bootstrap, topic, PARTITIONS) == want:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - the destination topic is not there yet
            pass
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"latency: {what} did not copy the markers of {topic} in {timeout} s")
        time.sleep(0.2)


def _start_mm2(ctx, res, libs, src, dst, topic):
    """MirrorMaker 2 in dedicated mode, as scripts/bench-mm2 runs it: (process, its log file)."""
    a = types.SimpleNamespace(partitions=PARTITIONS, codec=CODEC, batch_size=BATCH_SIZE, linger_ms=LINGER_MS)
    props = common.mm2.mm2_properties(src.bootstrap, dst.bootstrap, topic, a)
    res["mm2_properties"] = props
    cfg_path = os.path.join(dst.cluster.base_dir, "mm2-latency.properties")
    with open(cfg_path, "w") as f:
        f.write(props)
    cmd = common.mm2.mm2_command(libs, cfg_path)
    ctx.command(SECTION, "MirrorMaker 2", cmd)
    log = open(os.path.join(dst.cluster.base_dir, "mm2-latency.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log


def run(ctx):
    sz = _sizes(ctx.quick)
    res = {**sz, "partitions": PARTITIONS, "record": RECORD, "codec": CODEC, "linger_ms": LINGER_MS,
           "batch_size": BATCH_SIZE, "runs": [], "warmup_runs": [], "setup": {}}
    libs = common.mm2.mm2_libs("4.3.1")
    payload = common.bm.make_payload(os.path.join(common.REPO, ".cache", "bench-mirror-payload.txt"))
    src, dst = common.bm.Side("lat-src"), common.bm.Side("lat-dst")
    proxy = mm2 = mm2_log = None
    try:
        src.start()
        dst.start()
        classes = probe_classes(src.cluster)
        tag = int(time.time())
        ktopic, mtopic = f"lat-kmirror-{tag}", f"lat-mm2-{tag}"
        for t in (ktopic, mtopic):
            src.create_topic(t, PARTITIONS)
            _markers(src.bootstrap, t)

        # kmirror: kmirrord in front of the destination, the mirror started and caught up first.
        proxy, proxy_bs = common.bp.start_proxy(ctx.kmirrord, dst.cluster, ctx.out, [], "latency")
        ctx.command(SECTION, "kmirrord", [ctx.kmirrord, "--listen", proxy_bs, "--advertised-host", "127.0.0.1",
                                          "--broker-port-base", "...", "--broker-port-count", 2,
                                          "--upstream", dst.bootstrap, "--log-level", "warn"])
        cli = common.bm.Cli(ctx.kmirror, proxy_bs)
        common.bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 60, "kmirrord to answer")
        for argv in (["create", "--mirror", "lat", "--source-bootstrap", src.bootstrap],
                     ["start", "--mirror", "lat", "--topics", ktopic]):
            ctx.command(SECTION, f"kmirror {argv[0]}", [ctx.kmirror, "--bootstrap-server", proxy_bs, *argv])
            cli.run(*argv)
        res["setup"]["kmirror_markers_s"] = _caught_up(proxy_bs, src, ktopic, 120, "kmirrord", proxy.running)
        ctx.log(SECTION, f"kmirror caught up in {res['setup']['kmirror_markers_s']:.1f} s")

        # MirrorMaker 2: dedicated mode, started and caught up (markers across) before the runs.
        mm2, mm2_log = _start_mm2(ctx, res, libs, src, dst, mtopic)
        res["setup"]["mm2_markers_s"] = _caught_up(dst.bootstrap, src, mtopic, 300, "MirrorMaker 2",
                                                   lambda: mm2.poll() is None)
        ctx.log(SECTION, f"MirrorMaker 2 caught up in {res['setup']['mm2_markers_s']:.1f} s")

        systems = {"kmirror": (proxy_bs, ktopic, proxy.pid), "mm2": (dst.bootstrap, mtopic, mm2.pid)}
        # A warm-up round at the top rate, not counted: the brokers, MM2's JVM and the probe's start
        # cold, and whichever system ran first would pay for it.
        wsz = {**sz, "warmup_s": sz["warmup_s"] * 2, "measure_s": 1, "drain_s": 30}
        for name, (bs, topic, pid) in systems.items():
            r, _ = run_probe(ctx, src.cluster, classes, name, src.bootstrap, bs, topic, sz["rates"][-1],
                             wsz, payload, pid)
            res["warmup_runs"].append(r)
            ctx.log(SECTION, "warm-up " + _line(r))
        # Then, in each round, each rate with the two systems in turn, who goes first alternating
        # from rate to rate and from round to round.
        for rnd in range(sz.get("rounds", 1)):
            for i, rate in enumerate(sz["rates"]):
                for name in (("kmirror", "mm2") if (i + rnd) % 2 == 0 else ("mm2", "kmirror")):
                    bs, topic, pid = systems[name]
                    r, cfg = run_probe(ctx, src.cluster, classes, name, src.bootstrap, bs, topic, rate, sz,
                                       payload, pid)
                    r["order"] = len([x for x in res["runs"] if x["target_mb_s"] == rate
                                      and x.get("round", 0) == rnd])
                    r["round"] = rnd
                    res["probe_config"] = cfg
                    res["runs"].append(r)
                    ctx.log(SECTION, f"round {rnd + 1}: " + _line(r))
        res["kmirrord_rss_kib"] = common.bp.proc_rss_kib(proxy.pid)
        res["mm2_rss_kib"] = common.bp.proc_rss_kib(mm2.pid)
    finally:
        common.bm._admins.clear()  # librdkafka clients closed before the brokers go
        if mm2 is not None:
            common.mm2.mm2_stop(mm2)
        if mm2_log:
            mm2_log.close()
        if proxy is not None:
            proxy.stop(timeout=60)
        dst.stop()
        src.stop()
    return res


def _line(r):
    return (f"{r['system']} {r['target_mb_s']} MB/s: {r['rate_mib_s']:.2f} MB/s, {r['received']}/{r['sent']} "
            f"received, p50 {r['p50_us'] / 1000:.2f} p99 {r['p99_us'] / 1000:.2f} p999 {r['p999_us'] / 1000:.2f} "
            f"max {r['max_us'] / 1000:.2f} ms, {r['cpu_s']:.2f} CPU s")


def _ms(us):
    return f"{us / 1000:.1f}" if us >= 0 else "-"


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _rounds(runs):
    """Per (system, rate): the runs of every round folded into one: each percentile and the CPU
    seconds as the median over the rounds, the counts summed."""
    by = {}
    for r in runs:
        by.setdefault((r["system"], r["target_mb_s"]), []).append(r)
    out = {}
    for key, rs in by.items():
        m = {k: _median([r[k] for r in rs]) for k in ("p50_us", "p99_us", "p999_us", "max_us", "cpu_s",
                                                       "rate_mib_s", "ack_p50_us", "ack_p99_us")}
        m.update({k: sum(r[k] for r in rs) for k in ("sent", "received", "missing", "dups")})
        m["loadavg"] = " / ".join(str(r.get("loadavg", "?")) for r in rs)
        m["rounds"] = len(rs)
        out[key] = m
    return out


def report(res, ctx):
    runs = _rounds(res["runs"])
    nrounds = max((r.get("round", 0) for r in res["runs"]), default=0) + 1
    rates = res["rates"]
    out = [
        f"A probe (scripts/benchlib/LatencyProbe.java, one JVM) produces {RECORD}-byte records at a fixed "
        f"rate into a source topic of {res['partitions']} partitions and consumes them on the destination "
        f"side; latency = the consumer's `poll` returning the record − the producer's `send` call, both "
        f"`System.nanoTime()` of the one process (the send time is the value's first 8 bytes). Each rate "
        f"runs {res['warmup_s']} s of warm-up (not counted) then {res['measure_s']} s measured; after the "
        f"last measured send the probe waits up to {res.get('drain_s', 60)} s for every measured record "
        f"(missing: not seen by then). The producer: acks=all, "
        f"linger.ms={res['linger_ms']}, batch.size={res['batch_size']}, compression.type={res['codec']}, "
        f"values the bench payload (JSON-like text, compresses a few times). MB = MiB of record values.",
        "",
        "- **kmirror**: kmirrord in front of the destination, the mirror created and its topic started "
        "and caught up (a marker record per partition across) before the first run; the probe's "
        "consumer reads the mirror topic **through the proxy** (kmirrord's bootstrap).",
        "- **MirrorMaker 2**: connect-mirror 4.3.1, dedicated mode, started and caught up the same way "
        "(destination topic created by MM2, a marker per partition across) before its first run; the "
        "probe's consumer reads the destination topic **directly** from the destination broker, since "
        "that is how MM2 is deployed (it has no proxy).",
        "",
        "The same two clusters, producer and consumer settings for both. Both mirrors run throughout, "
        "each on its own source topic of the same shape, and the probe measures one at a time (the other "
        "idles): first a warm-up round at the top rate through each (not counted: the brokers, MM2's JVM "
        "and the probe start cold), then per rate one system after the other, who goes first alternating "
        "from rate to rate (kmirror first at the first rate). The consumer (both): " +
        f"`{res.get('probe_config', {}).get('consumer', '?')}`; fetch.min.bytes=1 means a broker answers a "
        "Fetch as soon as it has any record, so fetch.max.wait.ms (100) only bounds an idle wait. Both "
        "mirrors fetch from the source the same way: kmirrord's pipeline Fetch has MaxWait 500 ms, "
        "MinBytes 1 (src/mirror/pipeline.c), MM2's source consumer the Kafka defaults "
        "fetch.max.wait.ms=500, fetch.min.bytes=1.",
        "",
        (f"{nrounds} rounds: every rate through both systems, then again, the order alternating from rate "
         f"to rate and from round to round. The first table has, per system and rate, each percentile and "
         f"the CPU seconds as the **median over the rounds** (sent, received, missing and dups summed); "
         f"the table after it has every round. A stall of the shared machine (the source's own "
         f"acknowledgements slow too) sets one run's p999 by itself; the median shows what repeats."
         if nrounds > 1 else None),
        "" if nrounds > 1 else None,
        "CPU s: utime+stime (/proc/PID/stat) of kmirrord or of MM2's JVM from the start of the measured "
        "window to its last record seen (for kmirrord this includes proxying the probe's consumer). load: "
        "the machine's 1-minute load average as the run started (the machine is shared; the source's own "
        "acknowledgement times below show how much of the tail is the machine).",
        "",
    ]
    out = [x for x in out if x is not None]
    head = ["system", ":target MB/s", ":achieved MB/s", ":sent", ":received", ":missing", ":dups",
            ":p50 ms", ":p99 ms", ":p999 ms", ":max ms", ":CPU s", ":CPU s per GB", ":load"]
    rows = []
    for sysname in ("kmirror", "mm2"):
        for rate in rates:
            r = runs.get((sysname, rate))
            if not r:
                rows.append([sysname, rate] + ["-"] * (len(head) - 2))
                continue
            gb = r["sent"] / r.get("rounds", 1) * RECORD / 2**30
            rows.append([sysname if sysname == "kmirror" else "MM2", rate, f"{r['rate_mib_s']:.2f}", r["sent"],
                         r["received"], r["missing"], r["dups"], _ms(r["p50_us"]), _ms(r["p99_us"]),
                         _ms(r["p999_us"]), _ms(r["max_us"]), f"{r['cpu_s']:.2f}",
                         f"{r['cpu_s'] / gb:.1f}" if gb else "-", r.get("loadavg", "?")])
    out += [common.md_table(head, rows), ""]
    if nrounds > 1:
        rhead = ["round", "system", ":target MB/s", ":p50 ms", ":p99 ms", ":p999 ms", ":max ms",
                 ":source ack p99 ms", ":CPU s", ":load"]
        rrows = [[r.get("round", 0) + 1, r["system"] if r["system"] == "kmirror" else "MM2", r["target_mb_s"],
                  _ms(r["p50_us"]), _ms(r["p99_us"]), _ms(r["p999_us"]), _ms(r["max_us"]), _ms(r["ack_p99_us"]),
                  f"{r['cpu_s']:.2f}", r.get("loadavg", "?")]
                 for r in sorted(res["runs"], key=lambda x: (x.get("round", 0), x["target_mb_s"], x["order"]))]
        out += ["Every round, in the order run:", "", common.md_table(rhead, rrows), ""]

    ratio_rows = []
    for rate in rates:
        k, m = runs.get(("kmirror", rate)), runs.get(("mm2", rate))
        if not (k and m):
            continue

        def q(key):
            return f"{k[key] / m[key]:.2f}" if m[key] > 0 and k[key] >= 0 else "-"
        ratio_rows.append([rate, q("p50_us"), q("p99_us"), q("p999_us"), q("max_us"),
                           f"{k['cpu_s'] / m['cpu_s']:.2f}" if m["cpu_s"] > 0 else "-"])
    out += ["kmirror / MM2 (below 1: kmirror lower)" + (", of the medians over the rounds" if nrounds > 1 else "")
            + ", the figure:", "",
            common.md_table([":target MB/s", ":p50", ":p99", ":p999", ":max", ":CPU s"], ratio_rows), ""]

    missing = [r for r in res["runs"] if r["missing"] or r.get("send_errors")]
    if missing:
        out += ["Records not all received: " + "; ".join(
            f"{r['system']} at {r['target_mb_s']} MB/s: {r['missing']} of {r['sent']} missing, "
            f"{r.get('send_errors', 0)} send errors" for r in missing) + ".", ""]
    else:
        out += ["Every measured record was received by the consumer, for both systems at every rate "
                "(missing 0); dups counts records seen twice.", ""]
    dups = [r for r in res["runs"] if r["dups"]]
    if dups:
        out += ["Records the consumer received twice (the probe names the first ones, partition/offset at "
                "the first and the second delivery): " + "; ".join(
                    f"{r['system']} at {r['target_mb_s']} MB/s: {r['dups']} (" +
                    ", ".join(r.get("dup_examples", [])[:3]) + ")" for r in dups) + ".", ""]
    short = [r for r in res["runs"] if r["rate_mib_s"] < 0.95 * r["target_mb_s"]]
    if short:
        out += ["The probe fell short of the target rate in: " + "; ".join(
            f"{r['system']} {r['rate_mib_s']:.1f} of {r['target_mb_s']} MB/s" for r in short) +
            " (the probe's send loop could not keep the pace: blocked on the source's acknowledgements, "
            "or short of CPU on this shared machine).", ""]
    out += ["The path of a record, for reading the figures: kmirror: the source's append (acks=all), the "
            "pipeline's Fetch from the source (MinBytes 1: answered once the record is committed; one Fetch "
            "in flight per source broker), its Produce to the destination (acks=all), the proxy mapping the "
            "new batch once that Produce is answered (until then the batch is hidden from consumers), and the "
            "consumer's Fetch through the proxy. MM2: the source's append, one consumer per task fetching, "
            "Connect's producer to the destination (acks=all, linger.ms 5), the consumer's Fetch from the "
            "destination. While one system is measured the other idles (its CPU is not in the figures).", ""]
    acks = "; ".join(f"{r['system']} {r['target_mb_s']} MB/s {_ms(r['ack_p50_us'])} / {_ms(r['ack_p99_us'])}"
                     for r in res["runs"])
    out += [f"For scale, the source's own produce acknowledgement (acks=all) p50 / p99 in ms: {acks}. "
            f"Set-up: kmirror copied the markers {res['setup'].get('kmirror_markers_s', 0):.1f} s after "
            f"`kmirror start`, MM2 {res['setup'].get('mm2_markers_s', 0):.1f} s after its JVM started.", ""]

    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"p50_us": "tab:blue", "p99_us": "tab:orange", "p999_us": "tab:red"}
    for sysname, style, name in (("kmirror", "-o", "kmirror"), ("mm2", "--s", "MM2")):
        for key, col in colors.items():
            xs = [rate for rate in rates if (sysname, rate) in runs and runs[(sysname, rate)][key] > 0]
            ys = [runs[(sysname, rate)][key] / 1000 for rate in xs]
            if xs:
                ax.plot(xs, ys, style, color=col, label=f"{name} {key[:-3]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(rates)
    ax.set_xticklabels([str(r) for r in rates])
    ax.set_xlabel("produce rate, MB/s of 1 KiB records")
    ax.set_ylabel("latency, ms (log)")
    ax.set_title("Source produce to consumer receive")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(ctx.png("latency-percentiles.png"), dpi=110)
    plt.close(fig)
    out += ["![latency percentiles against rate, kmirror and MM2](latency-percentiles.png)", ""]
    out += ["MirrorMaker 2's configuration, in full:", "", "```properties",
            res.get("mm2_properties", "(not run)").rstrip(), "```", "",
            f"The probe's producer: `{res.get('probe_config', {}).get('producer', '?')}`."]
    return "\n".join(out) + "\n"
