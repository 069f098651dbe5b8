"""Section catchup: a source topic mirrored to an empty destination by kmirrord and by MirrorMaker 2,
and the destination's own ingest ceiling for the same batches, per partition count and codec."""

import os
import time
import types

from . import common

TITLE = "Mirror catch-up: kmirror against MirrorMaker 2 and the destination's ingest ceiling"
FULL = {"partitions": [1, 8, 64], "codecs": ["lz4", "zstd", "none"], "mib": 2048, "callgrind_mib": 128}
QUICK = {"partitions": [8], "codecs": ["lz4", "none"], "mib": 128, "callgrind_mib": 32}
MM2_VERSION = "4.3.1"


def _args(partitions, codec):
    """What the bench-mirror / bench-mm2 functions read from their command line."""
    return types.SimpleNamespace(partitions=partitions, codec=codec, batch_size=65536, linger_ms=10,
                                 poll_ms=100, stall_s=180, timeout_s=3600, perf_record=None, mirror_config=[])


def run(ctx):
    bm, mm2 = common.bm, common.mm2
    plan = QUICK if ctx.quick else FULL
    records = plan["mib"] * bm.MIB // bm.RECORD
    libs = mm2.mm2_libs(MM2_VERSION)
    payload = bm.make_payload(os.path.join(common.REPO, ".cache", "bench-mirror-payload.txt"))
    src, dst = bm.Side("catchup-src"), bm.Side("catchup-dst")
    proxy = None
    res = {"plan": plan, "records": records, "record_bytes": bm.RECORD, "mm2_version": MM2_VERSION, "rows": []}
    try:
        src.start()
        dst.start()
        proxy, proxy_bs = common.bp.start_proxy(ctx.kmirrord, dst.cluster, dst.cluster.base_dir, [], "catchup")
        cli = bm.Cli(ctx.kmirror, proxy_bs)
        bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 60, "kmirrord to answer")
        ctx.command("catchup", "kmirrord", ["kmirrord", "--listen", "127.0.0.1:PORT", "--advertised-host",
                                            "127.0.0.1", "--upstream", "DEST", "--log-level", "warn"])
        ctx.command("catchup", "kmirror, per topic", ["kmirror", "--bootstrap-server", "KMIRRORD", "create",
                                                      "--mirror", "bench-CODEC", "--source-bootstrap", "SOURCE"])
        ctx.command("catchup", "then", ["kmirror", "--bootstrap-server", "KMIRRORD", "start", "--mirror",
                                        "bench-CODEC", "--topics", "TOPIC"])
        ctx.command("catchup", "MirrorMaker 2 (per topic, configuration below)",
                    ["java", "-Xms512m", "-Xmx2g", "-cp", f".cache/mm2/{MM2_VERSION}/libs/*",
                     "org.apache.kafka.connect.mirror.MirrorMaker", "mm2.properties"])
        n = 0
        for partitions in plan["partitions"]:
            for codec in plan["codecs"]:
                a = _args(partitions, codec)
                a.mm2_run = n
                tag = f"p{partitions}-{codec}-{int(time.time())}"
                topic, itopic = f"catchup-{tag}", f"ingest-{tag}"
                src.create_topic(topic, partitions)
                ctx.log("catchup", f"P={partitions} {codec}: producing {plan['mib']} MiB to the source")
                prod = bm.perf_produce(src, topic, records, payload, codec, a)
                if n == 0:
                    ctx.command("catchup", "source data and ingest ceiling (kafka-producer-perf-test)",
                                ["kafka-producer-perf-test"] + bm.perf_command(
                                    "TOPIC", "BOOTSTRAP", records, "PAYLOAD", "CODEC", a))
                    res["mm2_properties"] = mm2.mm2_properties(src.bootstrap, dst.bootstrap, topic, a)
                disk = src.disk_bytes(topic, partitions)
                row = {"partitions": partitions, "codec": codec, "source_produce": prod,
                       "disk_mib": disk / bm.MIB if disk is not None else None}
                # The order alternates, so neither system always meets a warmer page cache.
                order = ["kmirror", "mm2", "ingest"] if n % 2 == 0 else ["mm2", "kmirror", "ingest"]
                row["order"] = order
                for what in order:
                    ctx.log("catchup", f"P={partitions} {codec}: {what}")
                    if what == "kmirror":
                        row["kmirror"] = bm.mirror_run(cli, proxy.pid, proxy_bs, src, topic, partitions, a, codec)
                        dst.delete_topic(topic)
                        bm.wait_until(lambda: topic not in dst.topics("--list").stdout.split(), 120,
                                      f"{topic} deleted")
                    elif what == "mm2":
                        for attempt in (1, 2):
                            try:
                                row["mm2"] = mm2.mm2_run(libs, dst.cluster.base_dir, src, dst, topic, partitions,
                                                         a)
                            except mm2.MirrorMakerStalled as e:
                                if attempt == 2:
                                    raise
                                # Seen once on the P = 64 lz4 row (GCLocker warnings in its log): run it
                                # again from an empty destination, and say so in the report.
                                ctx.log("catchup", f"P={partitions} {codec}: {e}; MirrorMaker run again")
                                row["mm2_stalled_before"] = str(e)
                            dst.delete_topic(topic)
                            bm.wait_until(lambda: topic not in dst.topics("--list").stdout.split(), 120,
                                          f"{topic} deleted")
                            if "mm2" in row:
                                break
                    else:
                        dst.create_topic(itopic, partitions)
                        row["ingest"] = bm.perf_produce(dst, itopic, records, payload, codec, a)
                        dst.delete_topic(itopic)
                mib = records * bm.RECORD / bm.MIB
                for k in ("kmirror", "mm2"):
                    r = row[k]
                    r["mb_s"] = mib / r["seconds"]
                    r["mb_per_cpu_s"] = mib / r["cpu_s"] if r["cpu_s"] else None
                    r["cpu_s_per_gib"] = r["cpu_s"] / (mib / 1024)
                    st = r.get("steady")
                    if st:
                        smib = st["records"] * bm.RECORD / bm.MIB
                        st["mb_s"] = smib / st["seconds"]
                        st["cpu_s_per_gib"] = st["cpu_s"] / (smib / 1024)
                        st["mb_per_cpu_s"] = smib / st["cpu_s"] if st["cpu_s"] > 0 else None
                ctx.log("catchup", f"P={partitions} {codec}: kmirror {row['kmirror']['mb_s']:.0f} MB/s, "
                        f"MM2 {row['mm2']['mb_s']:.0f} MB/s, ingest {row['ingest']['mb_s']:.0f} MB/s")
                res["rows"].append(row)
                src.delete_topic(topic)
                n += 1
        if plan.get("callgrind_mib"):
            # Alone on the destination: two kmirrords on one __mirror_state would both run the mirror.
            proxy.stop(timeout=60)
            proxy = None
            res["instructions"] = _instructions(ctx, plan, src, dst, payload)
    finally:
        common.bm._admins.clear()
        if proxy:
            proxy.stop(timeout=60)
        dst.stop()
        src.stop()
    return res


def _instructions(ctx, plan, src, dst, payload):
    """kmirrord's instructions per mirrored MB under callgrind (repeatable where seconds are not): a
    kmirrord started and stopped idle, then one that mirrors a lz4 topic of callgrind_mib MiB, P = 8;
    the idle count is taken off."""
    import tempfile
    bm, bp = common.bm, common.bp
    keep = tempfile.mkdtemp(prefix="kmirror-catchup-callgrind-")
    records = plan["callgrind_mib"] * bm.MIB // bm.RECORD
    a = _args(8, "lz4")
    a.stall_s = 600
    topic = f"callgrind-{int(time.time())}"
    src.create_topic(topic, 8)
    bm.perf_produce(src, topic, records, payload, "lz4", a)
    counts = {}
    for phase in ("idle", "mirror"):
        out = os.path.join(keep, f"callgrind-{phase}.out")
        d, bs = bp.start_proxy("valgrind", dst.cluster, dst.cluster.base_dir, [], f"callgrind-{phase}",
                               prefix=["--tool=callgrind", f"--callgrind-out-file={out}", ctx.kmirrord])
        try:
            cli = bm.Cli(ctx.kmirror, bs)
            bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 120, "kmirrord to answer")
            if phase == "mirror":
                bm.mirror_run(cli, d.pid, bs, src, topic, 8, a, "callgrind")
        finally:
            d.stop(timeout=300)
        counts[phase] = bp.callgrind_total(out)
    ctx.command("catchup", "instructions (callgrind, idle run taken off)",
                ["valgrind", "--tool=callgrind", "kmirrord", "...", "&", "kmirror", "start", "(lz4, P=8, "
                 f"{plan['callgrind_mib']} MiB)"])
    mib = records * bm.RECORD / bm.MIB
    return {"mib": mib, "idle": counts["idle"], "mirror": counts["mirror"],
            "per_mib": (counts["mirror"] - counts["idle"]) / mib, "dir": keep}


def _f(x, nd=1):
    return "?" if x is None else f"{x:,.{nd}f}"


def report(res, ctx):
    rows = res["rows"]
    plan = res["plan"]
    out = [f"{res['records']:,} records of {res['record_bytes']} B ({plan['mib']} MiB of values) per "
           f"topic, produced to the source by the perf test below (acks=all, batch.size 65536, "
           f"linger.ms 10, the codec named); one-broker KRaft clusters. For each partition count and "
           f"codec the same topic is mirrored into the empty destination by kmirrord (`kmirror start`) "
           f"and by MirrorMaker 2 {res['mm2_version']} (dedicated mode, the configuration in full "
           f"below), one after the other in the order given, then the destination's ingest ceiling is "
           f"measured by the same perf test writing the same records straight to the destination. "
           f"Time = from start (kmirror start; MirrorMaker's JVM launch) to every destination high "
           f"watermark equal to the source's; CPU = the process's user+system seconds over that time "
           f"(/proc), the JVM's start included; MB = MiB of record values.", ""]
    head = ["P", "codec", ":kmirror s", ":MM2 s", ":kmirror MB/s", ":MM2 MB/s", ":ingest MB/s",
            ":kmirror / MM2 MB/s", ":kmirror / ingest", ":kmirror CPU s/GB", ":MM2 CPU s/GB",
            ":kmirror / MM2 MB per CPU s", ":kmirror peak RSS MB", ":MM2 peak RSS MB", "order"]
    table = []
    for r in rows:
        k, m = r["kmirror"], r["mm2"]
        eff = k["mb_per_cpu_s"] / m["mb_per_cpu_s"] if k["mb_per_cpu_s"] and m["mb_per_cpu_s"] else None
        table.append([r["partitions"], r["codec"], _f(k["seconds"]), _f(m["seconds"]), _f(k["mb_s"]),
                      _f(m["mb_s"]), _f(r["ingest"]["mb_s"]), f"**{_f(k['mb_s'] / m['mb_s'], 2)}**",
                      f"**{_f(k['mb_s'] / r['ingest']['mb_s'], 2)}**", _f(k["cpu_s_per_gib"], 2),
                      _f(m["cpu_s_per_gib"], 2), f"**{_f(eff, 1)}**",
                      _f((k["peak_rss_kib"] or 0) / 1024, 0), _f((m["peak_rss_kib"] or 0) / 1024, 0),
                      " → ".join(r["order"])])
    out += [common.md_table(head, table), ""]
    out += ["MirrorMaker's first record reached the destination "
            + ", ".join(f"{_f(r['mm2']['first_record_s'])} s (P={r['partitions']} {r['codec']})" for r in rows)
            + " after its launch: that much of each MM2 time is its start-up.", ""]
    out += [f"P={r['partitions']} {r['codec']}: MirrorMaker's first run stalled and was stopped ({r['mm2_stalled_before']}); "
            "the row is its second run, on an empty destination." for r in rows if r.get("mm2_stalled_before")]
    effs = [r["kmirror"]["mb_per_cpu_s"] / r["mm2"]["mb_per_cpu_s"] for r in rows
            if r["kmirror"]["mb_per_cpu_s"] and r["mm2"]["mb_per_cpu_s"]]
    ing = [r["kmirror"]["mb_s"] / r["ingest"]["mb_s"] for r in rows]
    if effs:
        low = [f"P={r['partitions']} {r['codec']}" for r in rows
               if r["kmirror"]["mb_per_cpu_s"] and r["mm2"]["mb_per_cpu_s"]
               and r["kmirror"]["mb_per_cpu_s"] / r["mm2"]["mb_per_cpu_s"] < 10]
        why = (f": {', '.join(low)}, uncompressed records, where MirrorMaker has no codec work to redo while "
               f"kmirrord moves every byte of the values through the kernel twice, on the Fetch and on the "
               f"Produce; its CPU per GB there is the kernel's copy and TCP work, see the proxy section"
               if low and all(x.endswith("none") for x in low) else "")
        out.append(f"Goals: ≥ 10× MirrorMaker 2 in MB per CPU second — here {min(effs):.1f}× to "
                   f"{max(effs):.1f}× ({'met' if min(effs) >= 10 else 'missed where below 10' + why}); ≥ 0.8 of "
                   f"the destination's ingest ceiling — here {min(ing):.2f} to {max(ing):.2f} "
                   f"({'met' if min(ing) >= 0.8 else 'missed where below 0.8'}). kmirror writes the "
                   f"source's batches as they are, so it can pass the ceiling measured with a producer, "
                   f"which compresses and batches on the way.")
        out.append("")
    out += _steady(rows)
    ins = res.get("instructions")
    if ins:
        out += [f"Instructions (callgrind; repeatable where seconds on a shared machine are not): kmirrord "
                f"mirroring {ins['mib']:.0f} MiB of lz4 records (P = 8) executes "
                f"**{ins['per_mib'] / 1e6:.2f} M instructions per MiB** mirrored, its idle start and stop "
                f"({ins['idle'] / 1e6:.0f} M) taken off: the fetch, the batch walk and CRC check, the produce "
                f"and the state writes. That is about {ins['per_mib'] / 1048576:.2f} instructions per byte: "
                f"the bytes are moved, never copied record by record.", ""]
    out += _plot(rows, ctx)
    out += ["MirrorMaker 2's configuration, in full (the first topic's; only the topic, `tasks.max` = P "
            "and the codec change per row):", "", "```properties", res.get("mm2_properties", "").rstrip(),
            "```", ""]
    return "\n".join(out)


def _steady(rows):
    """The same runs without start-up: from the first poll that saw a mirrored record to the last."""
    rows = [r for r in rows if r["kmirror"].get("steady") and r["mm2"].get("steady")]
    if not rows:
        return []
    out = ["**Steady state** (the same runs, start-up left out): from the first poll (every 100 ms) that "
           "saw a mirrored record on the destination to every record there; MB = the records mirrored in "
           "that window, CPU = the process's user+system seconds over it. Start-up = the share of the "
           "whole run before that first record (MirrorMaker's JVM launch and task assignment; kmirror's "
           "start and the topic's creation).", ""]
    head = ["P", "codec", ":kmirror s", ":MM2 s", ":kmirror MB/s", ":MM2 MB/s", ":kmirror / MM2 MB/s",
            ":kmirror CPU s/GB", ":MM2 CPU s/GB", ":kmirror / MM2 MB per CPU s", ":start-up kmirror",
            ":start-up MM2"]
    table, effs = [], []
    for r in rows:
        k, m = r["kmirror"]["steady"], r["mm2"]["steady"]
        eff = k["mb_per_cpu_s"] / m["mb_per_cpu_s"] if k["mb_per_cpu_s"] and m["mb_per_cpu_s"] else None
        if eff:
            effs.append((eff, r))
        table.append([r["partitions"], r["codec"], _f(k["seconds"]), _f(m["seconds"]), _f(k["mb_s"]),
                      _f(m["mb_s"]), f"**{_f(k['mb_s'] / m['mb_s'], 2)}**", _f(k["cpu_s_per_gib"], 2),
                      _f(m["cpu_s_per_gib"], 2), f"**{_f(eff, 1)}**", f"{k['startup_share'] * 100:.0f} %",
                      f"{m['startup_share'] * 100:.0f} %"])
    out += [common.md_table(head, table), ""]
    if effs:
        low = [f"P={r['partitions']} {r['codec']} ({e:.1f}×)" for e, r in effs if e < 10]
        lo, hi = min(e for e, _ in effs), max(e for e, _ in effs)
        out += [f"Goal, steady state: ≥ 10× MirrorMaker 2 in MB per CPU second on every row — here {lo:.1f}× "
                f"to {hi:.1f}× ({'met' if not low else 'missed: ' + ', '.join(low)}).", ""]
    return out


def _plot(rows, ctx):
    plt = common.pyplot()
    labels = [f"P={r['partitions']}\n{r['codec']}" for r in rows]
    xs = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.27
    ax1.bar([x - w for x in xs], [r["kmirror"]["mb_s"] for r in rows], w, label="kmirror")
    ax1.bar(list(xs), [r["mm2"]["mb_s"] for r in rows], w, label="MirrorMaker 2")
    ax1.bar([x + w for x in xs], [r["ingest"]["mb_s"] for r in rows], w, label="destination ingest (producer)")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("MB/s (catch-up)")
    ax1.set_title("Throughput")
    ax1.legend(fontsize=8)
    ax2.bar([x - w / 2 for x in xs], [r["kmirror"]["mb_per_cpu_s"] or 0 for r in rows], w, label="kmirror")
    ax2.bar([x + w / 2 for x in xs], [r["mm2"]["mb_per_cpu_s"] or 0 for r in rows], w, label="MirrorMaker 2")
    ax2.set_yscale("log")
    ax2.set_xticks(list(xs), labels)
    ax2.set_ylabel("MB mirrored per CPU second (log)")
    ax2.set_title("Efficiency")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ctx.png("catchup.png"), dpi=90)
    plt.close(fig)
    return ["![catch-up throughput and efficiency, kmirror against MirrorMaker 2](catchup.png)", ""]
