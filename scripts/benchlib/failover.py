"""Section failover: `kmirror stop` of 1,000 mirrored partitions while the source is written to, the
source frozen (SIGSTOP of its broker's JVM) as in a disaster: the time until every partition accepts
a write through the proxy, and `kmirror stop --dry-run`'s records at risk against the truth read
from the source once it is thawed. Before the disaster, a planned one: the mirror paused with a
backlog, the producers stopped, the source reachable: the dry run asks the source and must equal
the truth on every partition."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from benchlib import common

TITLE = "Failover: stop of 1,000 partitions, and the records at risk"

# The load: a separate process (killed in the disaster: its unacknowledged records are no part of
# the truth), 1 KB records round robin over every partition, acks=all, paced to RATE bytes/s.
PRODUCER = r"""
import sys, time
from confluent_kafka import Producer
bootstrap, rate, size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
tps = [(t, int(p)) for t, p in (x.rsplit(":", 1) for x in sys.argv[4].split(","))]
tps = [(t, p) for t, n in tps for p in range(n)]
pr = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": "lz4",
               "queue.buffering.max.messages": 1000000, "enable.idempotence": True})
value, per_s, sent, t0, i = b"v" * size, rate / size, 0, time.monotonic(), 0
while True:
    due = int((time.monotonic() - t0) * per_s)
    while sent < due:
        t, p = tps[i % len(tps)]
        i += 1
        try:
            pr.produce(t, value=value, partition=p)
            sent += 1
        except BufferError:
            break
    pr.poll(0.005)
"""


def _sizes(ctx):
    if ctx.quick:
        return {"topics": 20, "partitions": 10, "rate": 2 << 20, "steady_s": 8}
    return {"topics": 100, "partitions": 10, "rate": 5 << 20, "steady_s": 20}


def _create_topics(bootstrap, names, partitions):
    """Every topic at once with the admin client (one JVM tool run per topic would take minutes)."""
    from confluent_kafka.admin import AdminClient, NewTopic
    ad = AdminClient({"bootstrap.servers": bootstrap})
    futs = ad.create_topics([NewTopic(t, partitions, 1) for t in names], request_timeout=120)
    for f in futs.values():
        f.result(180)
    for t in names:
        common.bm.wait_until(lambda t=t: all(h >= 0 for h in common.bm.high_watermarks(bootstrap, t, partitions)),
                             120, f"{t}'s leaders")


def _ends(bootstrap, names, partitions):
    """{(topic, partition): high watermark}, asked of the brokers now."""
    out = {}
    for t in names:
        for p, h in enumerate(common.bm.high_watermarks(bootstrap, t, partitions, timeout=30)):
            out[(t, p)] = h
    return out


def _kmirror(ctx, bootstrap, what, *args):
    """kmirror with --output json, timed; (seconds, document, argv text)."""
    argv = [ctx.kmirror, "--bootstrap-server", bootstrap, "--output", "json", "--timeout-ms", "120000"] + list(args)
    text = ctx.command("failover", what, argv)
    t = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    dt = time.monotonic() - t
    if r.returncode != 0:
        raise RuntimeError(f"failover: {text} exited {r.returncode}: {r.stderr}{r.stdout}")
    return dt, json.loads(r.stdout), text


def _describe(ctx, bootstrap, mirror):
    argv = [ctx.kmirror, "--bootstrap-server", bootstrap, "--output", "json", "describe", "--mirror", mirror]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, check=True)
    return json.loads(r.stdout)["mirrors"][0]


def _probe_producer(bootstrap):
    """The probe's producer through the proxy, connected with metadata before the clock matters."""
    from confluent_kafka import Producer
    pr = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "retries": 0,
                   "enable.idempotence": False, "message.timeout.ms": 10000, "request.timeout.ms": 10000,
                   "queue.buffering.max.messages": 100000})
    pr.list_topics(timeout=30)
    return pr


def _probe_run(pr, tps, t0, deadline_s):
    """One record to every partition (acks=all), each refused one sent again 20 ms later, until every
    partition has accepted one: ({(topic, partition): (seconds after t0, offset)}, refusals seen)."""
    done, inflight, again, refused = {}, set(), {}, [0]

    def cb(err, msg, tp):
        inflight.discard(tp)
        if err is None:
            done[tp] = (time.monotonic() - t0, msg.offset())
        else:
            refused[0] += 1
            again[tp] = time.monotonic() + 0.02

    end = time.monotonic() + deadline_s
    while len(done) < len(tps) and time.monotonic() < end:
        now = time.monotonic()
        for tp in tps:
            if tp in done or tp in inflight or again.get(tp, 0) > now:
                continue
            inflight.add(tp)
            pr.produce(tp[0], value=b"after-failover", partition=tp[1],
                       on_delivery=lambda e, m, tp=tp: cb(e, m, tp))
        pr.poll(0.005)
    pr.flush(15)
    return done, refused[0]


def _wait_lag(ctx, pb, mirror, n, rate, states=("MIRRORING",)):
    """Until every partition is in states with its lag known and the total lag is under half a
    second of the load, twice in a row; returns the seconds it took."""
    t0, ok, lags = time.monotonic(), 0, []
    while ok < 2:
        if time.monotonic() - t0 > 600:
            raise RuntimeError(f"failover: the mirror did not catch up in 600 s (lags {lags[-3:]})")
        m = _describe(ctx, pb, mirror)
        parts = [p for t in m["topics"] for p in t["partitions"]]
        lag = sum(p["lag"] for p in parts if p["lag"] >= 0)
        lags.append(lag)
        good = (len(parts) == n and all(p["state"] in states and p["lag"] >= 0 for p in parts)
                and lag * 1024 < rate / 2)
        ok = ok + 1 if good else 0
        time.sleep(1)
    return time.monotonic() - t0


def _planned(ctx, res, src, pb, mirror, names, P, tps, producer):
    """The planned failover's dry run: pause every topic (a backlog builds at the source while the
    load goes on 3 s), stop the producer (the source frozen and reachable), dry run, and the truth
    read from the source at once: source end - the proxy's end per partition."""
    _kmirror(ctx, pb, "pause every topic (the planned failover's backlog)", "pause", "--mirror", mirror,
             "--topics-regex", "fo-.*")
    common.bm.wait_until(lambda: all(p["state"] == "PAUSED" for t in _describe(ctx, pb, mirror)["topics"]
                                     for p in t["partitions"]), 120, "every partition PAUSED")
    time.sleep(3)
    producer.kill()
    producer.wait(30)
    time.sleep(1.0)  # the producer's last acknowledged records are in
    mirrored = _ends(pb, names, P)
    res["planned_dry_run_s"], dry, _ = _kmirror(ctx, pb, "the records at risk, source reachable", "stop",
                                                "--mirror", mirror, "--topics-regex", "fo-.*", "--dry-run")
    source = _ends(src.bootstrap, names, P)
    truth = {tp: source[tp] - mirrored[tp] for tp in tps}
    risk = {(t["name"], p["partition"]): p["records_at_risk"] for t in dry["topics"] for p in t["partitions"]}
    last = {(t["name"], p["partition"]): max(p["last_fetched_source_end_offset"] - mirrored[(t["name"], p["partition"])], 0)
            for t in dry["topics"] for p in t["partitions"]}
    res["planned_source_asked"] = dry.get("source_asked")
    res["planned_dry_total"] = dry["total_records_at_risk"]
    res["planned_last_fetched_total"] = sum(last.values())
    res["planned_truth_total"] = sum(truth.values())
    res["planned_agree"] = sum(risk.get(tp) == truth[tp] for tp in tps)
    _kmirror(ctx, pb, "resume every topic", "resume", "--mirror", mirror, "--topics-regex", "fo-.*")


def run(ctx):
    sz = _sizes(ctx)
    names = [f"fo-{i:03d}" for i in range(sz["topics"])]
    P = sz["partitions"]
    tps = [(t, p) for t in names for p in range(P)]
    res = {"topics": sz["topics"], "partitions_per_topic": P, "partitions": len(tps), "rate_bytes_s": sz["rate"],
           "record_bytes": 1024, "steady_s": sz["steady_s"]}
    src = common.bm.Side("fo-src").start()
    dst = producer = daemon = pr = None
    frozen = None
    try:
        dst = common.bm.Side("fo-dst").start()
        ctx.log("failover", f"creating {len(names)} topics x {P} partitions on the source")
        _create_topics(src.bootstrap, names, P)
        daemon, pb = common.bp.start_proxy(ctx.kmirrord, dst.cluster, dst.cluster.base_dir, [], "failover")
        mirror = "failover"
        _kmirror(ctx, pb, "create the mirror", "create", "--mirror", mirror, "--source-bootstrap", src.bootstrap)
        argv = [sys.executable, "-c", PRODUCER, src.bootstrap, str(sz["rate"]), "1024",
                ",".join(f"{t}:{P}" for t in names)]
        ctx.command("failover", "the load (confluent-kafka, the script in scripts/benchlib/failover.py)",
                    ["python3", "-c", "PRODUCER", src.bootstrap, sz["rate"], 1024, f"fo-000:{P},...,fo-{len(names) - 1:03d}:{P}"])
        producer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_start, _, _ = _kmirror(ctx, pb, "start mirroring every topic", "start", "--mirror", mirror,
                                 "--topics", ",".join(names))
        res["start_s"] = t_start
        # 1. caught up and running under the load: every partition MIRRORING with its lag known, and
        # the total lag under half a second of the load, twice in a row.
        res["catch_up_s"] = _wait_lag(ctx, pb, mirror, len(tps), sz["rate"])
        # 1b. the planned failover's dry run (source reachable), then the load again and caught up
        _planned(ctx, res, src, pb, mirror, names, P, tps, producer)
        producer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_lag(ctx, pb, mirror, len(tps), sz["rate"])
        ctx.log("failover", f"caught up after {res['catch_up_s']:.0f} s; {sz['steady_s']} s under the load")
        time.sleep(sz["steady_s"])
        m = _describe(ctx, pb, mirror)
        res["lag_before_disaster"] = sum(p["lag"] for t in m["topics"] for p in t["partitions"] if p["lag"] >= 0)
        # 2. the disaster: the source broker's JVM frozen, then the producer killed.
        frozen = src.cluster.nodes[min(src.cluster.nodes)].pid
        os.kill(frozen, signal.SIGSTOP)
        t_freeze = time.monotonic()
        producer.kill()
        producer.wait(30)
        producer = None
        time.sleep(1.0)  # what was in flight to the destination lands
        # 3. the dry run, between two reads of the proxy's ends (the mirrored ends: nothing moves now)
        end_a = _ends(pb, names, P)
        res["dry_run_s"], dry, _ = _kmirror(ctx, pb, "the records at risk", "stop", "--mirror", mirror,
                                            "--topics-regex", "fo-.*", "--dry-run")
        end_b = _ends(pb, names, P)
        res["proxy_ends_moved"] = sum(end_b[tp] != end_a[tp] for tp in tps)
        dry_risk = {(t["name"], p["partition"]): p["records_at_risk"] for t in dry["topics"] for p in t["partitions"]}
        dry_mirrored = {(t["name"], p["partition"]): p["mirrored_offset"] for t in dry["topics"]
                        for p in t["partitions"]}
        res["dry_total"] = dry["total_records_at_risk"]
        res["dry_source_asked"] = dry.get("source_asked")
        res["dry_source_error"] = dry.get("source_error")
        ages = [p["last_fetched_age_ms"] for t in dry["topics"] for p in t["partitions"] if p["last_fetched_age_ms"] >= 0]
        res["dry_age_max_ms"] = max(ages) if ages else None
        res["dry_unknown"] = dry["partitions_unknown"]
        res["dry_mirrored_vs_proxy"] = sum(dry_mirrored.get(tp) != end_b[tp] for tp in tps)
        # 4. the stop, timed from the command's start, and the probe writes through the proxy
        pr = _probe_producer(pb)
        stop_out = {}

        def stop_cmd():
            stop_out["s"], stop_out["doc"], _ = _kmirror(ctx, pb, "the failover", "stop", "--mirror", mirror,
                                                         "--topics-regex", "fo-.*")
        th = threading.Thread(target=stop_cmd)
        t_stop = time.monotonic()
        th.start()
        done, nref = _probe_run(pr, tps, t_stop, 120)
        th.join(300)
        res["stop_cmd_s"] = stop_out.get("s")
        res["stop_refused_topics"] = sum(1 for t in stop_out.get("doc", {}).get("topics", []) if t["error"])
        res["probe_refusals"] = nref
        res["writable"] = len(done)
        times = sorted(v[0] for v in done.values())
        res["writable_times"] = times
        res["all_writable_s"] = times[-1] if len(done) == len(tps) else None
        res["offset_mismatch"] = sum(1 for tp, (_, off) in done.items() if off != end_b[tp])
        res["offset_mismatch_examples"] = [[tp[0], tp[1], end_b[tp], off] for tp, (_, off) in done.items()
                                           if off != end_b[tp]][:5]
        # 5. the truth: the source thawed, its ends; at risk = source end - mirrored end
        os.kill(frozen, signal.SIGCONT)
        res["frozen_s"] = time.monotonic() - t_freeze
        frozen = None
        common.bm.wait_until(lambda: _ends(src.bootstrap, names[:1], P), 120, "the source to answer again")
        truth_end = _ends(src.bootstrap, names, P)
        truth = {tp: truth_end[tp] - end_b[tp] for tp in tps}
        res["truth_total"] = sum(truth.values())
        res["agree"] = sum(dry_risk.get(tp) == truth[tp] for tp in tps)
        res["dry_over"] = sum(1 for tp in tps if dry_risk.get(tp, -1) > truth[tp])
        res["per_partition"] = [[tp[0], tp[1], dry_risk.get(tp, -1), truth[tp]] for tp in tps]
        m = _describe(ctx, pb, mirror)
        res["states_after"] = sorted({p["state"] for t in m["topics"] for p in t["partitions"]})
        res["kmirrord_rss_kib"] = common.bp.proc_rss_kib(daemon.proc.pid)
        res["kmirrord_cpu_s"] = common.bp.proc_cpu_seconds(daemon.proc.pid)
        return res
    finally:
        # bench-mirror's cached admin clients would log reconnects to the stopped clusters
        common.bm._admins.clear()
        pr = None  # noqa: F841 - the probe's producer goes before its proxy
        if frozen:
            os.kill(frozen, signal.SIGCONT)
        if producer:
            producer.kill()
        if daemon:
            daemon.stop()
        if dst:
            dst.stop()
        src.stop()


def report(res, ctx):
    n = res["partitions"]
    mb = res["rate_bytes_s"] / (1 << 20)
    allw = res.get("all_writable_s")
    lines = [
        f"{res['topics']} topics x {res['partitions_per_topic']} partitions = {n} partitions on a one-broker source, "
        f"mirrored by kmirrord into a one-broker destination while a confluent-kafka producer (a process of its own) "
        f"writes {mb:.0f} MB/s of 1 KB records (lz4, acks=all, idempotent) round robin to all of them. Once every "
        f"partition is MIRRORING with the total lag under half a second of the load ({res['catch_up_s']:.0f} s after "
        f"start) and {res['steady_s']} s more under the load, the disaster: SIGSTOP of the source broker's JVM, then "
        f"the producer killed (its unacknowledged records are no part of the truth). Then "
        f"`kmirror stop --dry-run` of every topic, and `kmirror stop`; from the stop command's start, one record "
        f"(acks=all) to every partition through the proxy, each refused one sent again 20 ms later, until all "
        f"accepted one. The truth: the source thawed (SIGCONT), its end offsets minus the mirrored ends (the "
        f"proxy's high watermarks before the probe writes).", "",
        "Before the disaster, a planned failover's dry run: every topic paused while the load goes on 3 s (a "
        "backlog at the source), the producer stopped (the source frozen and reachable), `kmirror stop --dry-run`, "
        "and the truth read from the source at once (its end offsets minus the proxy's); then resumed, the load "
        "again, caught up.", ""]
    rows = [
        ["partitions", n],
        ["`stop --dry-run` (s)", f"{res['dry_run_s']:.2f}"],
        ["`stop` command (s)", f"{res['stop_cmd_s']:.2f}" if res.get("stop_cmd_s") is not None else "-"],
        ["all writable through the proxy (s, from the stop's start)", f"{allw:.2f}" if allw is not None else
         f"not all: {res['writable']} of {n}"],
        ["first write accepted (s)", f"{res['writable_times'][0]:.2f}" if res["writable_times"] else "-"],
        ["writes refused before they were accepted", res["probe_refusals"]],
        ["partitions whose first write is not at the mirrored end", res["offset_mismatch"]],
        ["planned (source reachable): source asked", res.get("planned_source_asked")],
        ["planned: records at risk, dry run (total)", res.get("planned_dry_total")],
        ["planned: records at risk, truth (total)", res.get("planned_truth_total")],
        ["planned: kmirrord's last fetched figure would have said (total)", res.get("planned_last_fetched_total")],
        ["planned: partitions where dry run = truth", f"{res.get('planned_agree')} of {n}"],
        ["disaster (source frozen by SIGSTOP): source asked", res.get("dry_source_asked")],
        ["disaster: the dry run's note", res.get("dry_source_error") or "-"],
        ["disaster: age of kmirrord's last figure, at most (ms)", res.get("dry_age_max_ms")],
        ["records at risk, dry run (total)", res["dry_total"]],
        ["records at risk, truth (total)", res["truth_total"]],
        ["partitions where dry run = truth", f"{res['agree']} of {n}"],
        ["partitions where the dry run says more than the truth", res["dry_over"]],
        ["dry run's mirrored offset != the proxy's end", res["dry_mirrored_vs_proxy"]],
        ["states after", ", ".join(res["states_after"])],
    ]
    lines.append(common.md_table(["what", ":value"], rows))
    lines.append("")
    ratio = res["dry_total"] / res["truth_total"] if res["truth_total"] else None
    lines.append(
        "The figure is the dry run against the truth measured in the same run: "
        + (f"{ratio:.3f} of the records truly at risk were reported. " if ratio is not None else
           "nothing was at risk. ")
        + "With the source frozen by SIGSTOP the dry run cannot ask it (its connection times out), says so, and "
        "counts up to kmirrord's last figure per partition, with its age; what the source acknowledged after "
        "kmirrord's last Fetch answer (at most one fetch round) is not counted, which is where dry run and truth "
        "part. With the source reachable (the planned row) the dry run asks its leaders and equals the truth.")
    goal = 2.0
    if allw is not None and allw <= goal:
        lines.append(f"All {n} partitions were writable {allw:.2f} s after the stop started: within the "
                     f"issue's goal of {goal:.0f} s.")
    else:
        lines.append(
            f"Goal missed: the issue asks all {n} partitions writable within {goal:.0f} s of the stop; "
            + (f"it took {allw:.2f} s. " if allw is not None else f"only {res['writable']} were writable. ")
            + (f"The stop command itself returned after {res['stop_cmd_s']:.2f} s; the rest is each partition "
               "settling in the pipeline (drain, the run at the tail and STOPPED persisted to __mirror_state) "
               "and the probe's 20 ms between a refused write and the next. Before the pipeline stopped waiting "
               "for a Fetch in flight to the frozen source, the last partitions took the source connection's "
               "31 s request timeout (44 s in a quick run); what is left is to be profiled on a quiet machine." if
               res.get("stop_cmd_s") is not None else ""))
    lines.append("")
    png = ctx.png("failover-writable.png")
    try:
        plt = common.pyplot()
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        ts = res["writable_times"]
        a1.step([0] + ts, list(range(0, len(ts) + 1)), where="post")
        a1.axvline(goal, color="grey", ls="--", lw=0.8, label=f"goal {goal:.0f} s")
        if res.get("stop_cmd_s") is not None:
            a1.axvline(res["stop_cmd_s"], color="tab:red", ls=":", lw=0.8, label="stop command returned")
        a1.set_xlabel("seconds after `kmirror stop` started")
        a1.set_ylabel("partitions that accepted a write")
        a1.set_title(f"writable after stop ({n} partitions)")
        a1.legend(loc="lower right")
        dr = [max(r[2], 0) for r in res["per_partition"]]
        tr = [r[3] for r in res["per_partition"]]
        a2.scatter(tr, dr, s=6, alpha=0.6)
        hi = max(tr + dr + [1])
        a2.plot([0, hi], [0, hi], color="grey", lw=0.8, ls="--", label="dry run = truth")
        a2.set_xlabel("truth: source end - mirrored end")
        a2.set_ylabel("`stop --dry-run` records at risk")
        a2.set_title(f"records at risk per partition ({res['agree']} of {n} equal)")
        a2.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        plt.close(fig)
        lines.append("![writable partitions after stop; dry run vs truth](failover-writable.png)")
    except Exception as e:  # noqa: BLE001 - the numbers stand without the plot
        lines.append(f"(no plot: {e})")
    return "\n".join(lines)
