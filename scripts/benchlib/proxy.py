"""Section proxy: Kafka's producer and consumer perf tests direct to the destination broker and through
kmirrord, for a plain topic, with a mirror running (a mirror topic read, every Produce walked by the
read-only check), and with 1,000 idle client connections open; kmirrord's CPU seconds per GB it
forwards, and (full run) its instructions per MB under callgrind."""

import resource
import statistics
import time
import types

from . import common

TITLE = "Proxy overhead: direct against through kmirrord"
FULL = {"records": 1_000_000, "size": 512, "partitions": 6, "runs": 3, "idle": 1000, "callgrind": 200_000}
QUICK = {"records": 200_000, "size": 512, "partitions": 6, "runs": 1, "idle": 1000, "callgrind": 0}
PHASES = [("plain", "a plain topic, no mirror on kmirrord"),
          ("mirror", "a mirror running: Produce to a plain topic (walked by the read-only check), "
                     "Fetch of the mirror topic (offsets translated)"),
          ("idle", "a plain topic with 1,000 idle client connections open to the same address")]


def _raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def _mirror_topic(ctx, plan, src, dst, proxy_bs):
    """A source topic of the run's size mirrored into the destination through kmirrord, caught up."""
    bm = common.bm
    topic = "proxy-mirrored"
    src.create_topic(topic, plan["partitions"])
    common.bp.producer_perf(src.cluster, src.bootstrap, topic, plan["records"], plan["size"], -1)
    cli = bm.Cli(ctx.kmirror, proxy_bs)
    bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 60, "kmirrord to answer")
    cli.run("create", "--mirror", "bench", "--source-bootstrap", src.bootstrap)
    cli.run("start", "--mirror", "bench", "--topics", topic)
    want = bm.high_watermarks(src.bootstrap, topic, plan["partitions"])
    bm.wait_until(lambda: bm.high_watermarks(proxy_bs, topic, plan["partitions"]) == want, 300,
                  f"{topic} mirrored")
    return topic


def run(ctx):
    bp, bm = common.bp, common.bm
    plan = QUICK if ctx.quick else FULL
    _raise_nofile(4 * plan["idle"] + 256)
    src, dst = bm.Side("proxy-src"), bm.Side("proxy-dst")
    proxy = None
    res = {"plan": plan, "runs": []}
    ctx.command("proxy", "produce", ["kafka-producer-perf-test", "--topic", "TOPIC", "--num-records",
                                     plan["records"], "--record-size", plan["size"], "--throughput", -1,
                                     "--producer-props", "bootstrap.servers=DIRECT_OR_KMIRRORD", "acks=all"])
    ctx.command("proxy", "consume", ["kafka-consumer-perf-test", "--bootstrap-server", "DIRECT_OR_KMIRRORD",
                                     "--topic", "TOPIC", "--num-records", plan["records"], "--timeout", 120000])
    try:
        src.start()
        dst.start()
        # 1,000 idle connections and the clients, all from 127.0.0.1: past the default per-address cap.
        proxy, proxy_bs = bp.start_proxy(ctx.kmirrord, dst.cluster, dst.cluster.base_dir,
                                         ["max-connections-per-ip=0"], "proxy")
        routes = {"direct": dst.bootstrap, "proxy": proxy_bs}
        # On the fresh process: after the throughput runs its heap has room for idle connections.
        res["rss_idle"] = bp.rss_per_connection(proxy.pid, "127.0.0.1", int(proxy_bs.rsplit(":", 1)[1]),
                                                plan["idle"])
        mtopic = None
        for phase, _ in PHASES:
            if phase == "mirror":
                mtopic = _mirror_topic(ctx, plan, src, dst, proxy_bs)
            for run in range(plan["runs"]):
                for mode in (["direct", "proxy"] if run % 2 == 0 else ["proxy", "direct"]):
                    bs = routes[mode]
                    host, port = bs.rsplit(":", 1)
                    idle = bp.open_idle_connections(host, int(port), plan["idle"]) if phase == "idle" else []
                    try:
                        topic = f"proxy-{phase}-{mode}-{run}"
                        dst.create_topic(topic, plan["partitions"])
                        cpu0 = bp.proc_cpu_seconds(proxy.pid)
                        prod = bp.producer_perf(dst.cluster, bs, topic, plan["records"], plan["size"], -1)
                        cpu1 = bp.proc_cpu_seconds(proxy.pid)
                        cons = bp.consumer_perf(dst.cluster, bs, mtopic if phase == "mirror" else topic,
                                                plan["records"])
                        cpu2 = bp.proc_cpu_seconds(proxy.pid)
                        rss = bp.proc_rss_kib(proxy.pid)
                    finally:
                        for s in idle:
                            s.close()
                    r = {"phase": phase, "run": run, "mode": mode, "produce": prod, "consume": cons,
                         "cpu_produce": cpu1 - cpu0, "cpu_consume": cpu2 - cpu1, "rss_kib": rss}
                    ctx.log("proxy", f"{phase} run {run} {mode}: produce {prod['mb_s']:.1f} MB/s, "
                            f"consume {cons['mb_s']:.1f} MB/s, kmirrord CPU {r['cpu_produce']:.2f} / "
                            f"{r['cpu_consume']:.2f} s")
                    res["runs"].append(r)
                    dst.delete_topic(topic)
    finally:
        common.bm._admins.clear()
        if proxy:
            proxy.stop(timeout=60)
        dst.stop()
        src.stop()
    if plan["callgrind"]:
        ctx.log("proxy", f"callgrind: {plan['callgrind']:,} records each way")
        a = types.SimpleNamespace(callgrind=plan["callgrind"], size=plan["size"], partitions=plan["partitions"],
                                  proxy_opt=[], compare=None, read_only=False)
        ctx.command("proxy", "instructions per MB", ["scripts/bench-proxy", "--callgrind", plan["callgrind"]])
        res["callgrind"] = bp.instructions(a)["proxy"]
    return res


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def summary(res):
    """Per phase: medians of direct and proxy MB/s, the ratios, kmirrord CPU s per GB."""
    size_gb = res["plan"]["records"] * res["plan"]["size"] / 1e9
    out = {}
    for phase, _ in PHASES:
        runs = [r for r in res["runs"] if r["phase"] == phase]
        if not runs:
            continue

        def med(mode, key):
            return _med([r[key]["mb_s"] for r in runs if r["mode"] == mode])
        p = [r for r in runs if r["mode"] == "proxy"]
        out[phase] = {
            "produce_direct": med("direct", "produce"), "produce_proxy": med("proxy", "produce"),
            "consume_direct": med("direct", "consume"), "consume_proxy": med("proxy", "consume"),
            "cpu_gb_produce": _med([r["cpu_produce"] for r in p]) / size_gb,
            "cpu_gb_consume": _med([r["cpu_consume"] for r in p]) / size_gb,
        }
        o = out[phase]
        o["produce_ratio"] = o["produce_proxy"] / o["produce_direct"]
        o["consume_ratio"] = o["consume_proxy"] / o["consume_direct"]
    return out


def report(res, ctx):
    plan = res["plan"]
    s = summary(res)
    out = [f"{plan['records']:,} records of {plan['size']} B per run ({plan['records'] * plan['size'] / 1e6:.0f} MB), "
           f"{plan['partitions']} partitions, acks=all, {plan['runs']} run(s) per mode alternating which "
           f"goes first; one-broker KRaft destination, kmirrord in front of it. Phases: "
           + "; ".join(f"**{p}**: {what}" for p, what in PHASES)
           + ". kmirrord CPU = its user+system seconds over each perf test (/proc), per GB forwarded.", ""]
    head = ["phase", ":produce direct MB/s", ":produce proxy MB/s", ":proxy / direct",
            ":consume direct MB/s", ":consume proxy MB/s", ":proxy / direct",
            ":kmirrord CPU s/GB produce", ":kmirrord CPU s/GB consume"]
    rows = [[p, f"{o['produce_direct']:.1f}", f"{o['produce_proxy']:.1f}", f"**{o['produce_ratio']:.3f}**",
             f"{o['consume_direct']:.1f}", f"{o['consume_proxy']:.1f}", f"**{o['consume_ratio']:.3f}**",
             f"{o['cpu_gb_produce']:.2f}", f"{o['cpu_gb_consume']:.2f}"] for p, o in s.items()]
    out += [common.md_table(head, rows), "", "Medians over the runs; every run:", ""]
    out += [common.md_table(["phase", "run", "mode", ":produce MB/s", ":consume MB/s", ":kmirrord CPU s produce",
                             ":kmirrord CPU s consume", ":kmirrord RSS MB"],
                            [[r["phase"], r["run"], r["mode"], f"{r['produce']['mb_s']:.1f}",
                              f"{r['consume']['mb_s']:.1f}",
                              f"{r['cpu_produce']:.2f}" if r["mode"] == "proxy" else "",
                              f"{r['cpu_consume']:.2f}" if r["mode"] == "proxy" else "",
                              f"{r['rss_kib'] / 1024:.1f}" if r["mode"] == "proxy" else ""]
                             for r in res["runs"]]), ""]
    ri = res.get("rss_idle")
    if ri:
        many = ri["rss_%d_kib" % plan["idle"]]
        out += [f"kmirrord RSS with idle connections: {ri['rss_1_kib'] / 1024:.1f} MB with 1, "
                f"{many / 1024:.1f} MB with {plan['idle']:,}: "
                f"{ri['kib_per_conn']} KiB per connection (client and upstream side).", ""]
    cg = res.get("callgrind")
    if cg:
        out += [f"Instructions (callgrind, {plan['callgrind']:,} records of {plan['size']} B each way): "
                f"{cg['produce']:,.0f} per MB produced, {cg['consume']:,.0f} per MB consumed "
                f"(about {cg['produce'] / 1e3:,.0f} and {cg['consume'] / 1e3:,.0f} instructions per KB); "
                f"so kmirrord's own code is a small part of its CPU time, the rest is the kernel's "
                f"(system calls, TCP on loopback, wake-ups).", ""]
    worst_p = min(o["produce_ratio"] for o in s.values())
    worst_c = min(o["consume_ratio"] for o in s.values())
    cpu_p = max(o["cpu_gb_produce"] for o in s.values())
    cpu_c = max(o["cpu_gb_consume"] for o in s.values())
    out += [f"Goals: produce ≥ 0.97 of direct — worst phase {worst_p:.3f} "
            f"({'met' if worst_p >= 0.97 else 'missed'}); consume ≥ 0.95 — worst {worst_c:.3f} "
            f"({'met' if worst_c >= 0.95 else 'missed'}); kmirrord under 0.5 CPU s per GB — produce up to "
            f"{cpu_p:.2f}, consume up to {cpu_c:.2f} "
            f"({'met' if max(cpu_p, cpu_c) < 0.5 else 'missed: see the profile in the text after the suite'}).",
            ""]
    out += _plot(s, ctx)
    return "\n".join(out)


def _plot(s, ctx):
    plt = common.pyplot()
    phases = list(s)
    xs = range(len(phases))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.35
    ax1.bar([x - w / 2 for x in xs], [s[p]["produce_ratio"] for p in phases], w, label="produce")
    ax1.bar([x + w / 2 for x in xs], [s[p]["consume_ratio"] for p in phases], w, label="consume")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylim(0, 1.2)
    ax1.set_xticks(list(xs), phases)
    ax1.set_ylabel("through kmirrord / direct (MB/s)")
    ax1.set_title("Throughput ratio")
    ax1.legend(fontsize=8)
    ax2.bar([x - w / 2 for x in xs], [s[p]["cpu_gb_produce"] for p in phases], w, label="produce")
    ax2.bar([x + w / 2 for x in xs], [s[p]["cpu_gb_consume"] for p in phases], w, label="consume")
    ax2.axhline(0.5, color="red", lw=0.8, ls="--", label="goal 0.5")
    ax2.set_xticks(list(xs), phases)
    ax2.set_ylabel("kmirrord CPU seconds per GB forwarded")
    ax2.set_title("Proxy CPU")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ctx.png("proxy.png"), dpi=90)
    plt.close(fig)
    return ["![proxy throughput ratio and CPU per GB](proxy.png)", ""]
