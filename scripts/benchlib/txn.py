"""Section txn: a transactional source. Source transactions mirrored a second onto a 3-broker
destination, each carried by a destination transaction of its own per partition (docs/mirror.md,
"Transactions"), next to the pace of one transactional producer of the same transactions straight
into the destination (the destination's own ceiling for transactions one after the other, which is
what a partition's mirror is bound to: a transaction's marker must land before the next one's data).

--before BINARY (scripts/bench) also runs an earlier kmirrord on the same source topics, in the same
run, the two alternating which goes first."""

import os
import time
import types

from benchlib import common
from harness import KafkaCluster

TITLE = "Transactions: a transactional source onto three brokers"

RECORD = 200
K = 3  # records per partition and transaction


def _plan(ctx):
    if ctx.quick:
        return {"partitions": [1], "transactions": 200}
    return {"partitions": [1, 3], "transactions": 600}


def _produce(bootstrap, topic, partitions, n, txid):
    """n transactions of K records on each partition, committed one after the other by one
    transactional producer (librdkafka); the seconds it took. (No aborts: librdkafka's
    abort_transaction failed fatally with INVALID_TXN_STATE against the three 4.4.0 brokers; a
    mirrored ABORT marker costs the mirror what a COMMIT does.)"""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid, "linger.ms": 0,
                  "compression.type": "lz4"})
    p.init_transactions(60)
    value = b"t" * RECORD
    t0 = time.monotonic()
    for i in range(n):
        p.begin_transaction()
        for part in range(partitions):
            for k in range(K):
                p.produce(topic, key=f"{i}.{k}".encode(), value=value, partition=part)
        p.commit_transaction(60)
    dt = time.monotonic() - t0
    p.flush(60)
    return dt


def run(ctx):
    bm = common.bm
    plan = _plan(ctx)
    src, dst = bm.Side("txn-src"), bm.Side("txn-dst")
    dst.cluster = KafkaCluster("txn-dst", brokers=3)
    binaries = [("kmirror", ctx.kmirrord)] + ([("before", ctx.before)] if ctx.before else [])
    proxies = {}
    res = {"plan": plan, "record_bytes": RECORD, "per_partition": K, "rows": [],
           "binaries": {name: path for name, path in binaries}}
    a = types.SimpleNamespace(mirror_config=[], stall_s=120, poll_ms=20, perf_record=None)
    try:
        src.start()
        dst.start()
        for name, path in binaries:
            # Each its own state topic: two kmirrords on one would share the mirrors.
            proxies[name] = common.bp.start_proxy(path, dst.cluster, dst.cluster.base_dir,
                                                  [f"mirror-state-topic=__mirror_state_{name}"], f"txn-{name}")
        ctx.command("txn", "kmirrord", ["kmirrord", "--listen", "127.0.0.1:PORT", "--advertised-host", "127.0.0.1",
                                        "--upstream", "DEST", "--log-level", "warn"])
        ctx.command("txn", "then", ["kmirror", "--bootstrap-server", "KMIRRORD", "start", "--mirror", "bench-txn-P",
                                    "--topics", "TOPIC"])
        n = 0
        for partitions in plan["partitions"]:
            topic, itopic = f"txn-p{partitions}-{int(time.time())}", f"ingest-txn-p{partitions}-{int(time.time())}"
            src.create_topic(topic, partitions)
            ctx.log("txn", f"P={partitions}: {plan['transactions']} transactions to the source")
            row = {"partitions": partitions, "transactions": plan["transactions"],
                   "source_s": _produce(src.bootstrap, topic, partitions, plan["transactions"], f"bench-src-{topic}")}
            dst.create_topic(itopic, partitions)
            row["ingest_s"] = _produce(dst.bootstrap, itopic, partitions, plan["transactions"], f"bench-dst-{itopic}")
            dst.delete_topic(itopic)
            order = [name for name, _ in binaries]
            if n % 2:
                order.reverse()
            row["order"] = order
            for name in order:
                proxy, bs = proxies[name]
                cli = bm.Cli(ctx.kmirror, bs)
                bm.wait_until(lambda: cli.run("list", check=False).returncode == 0, 60, "kmirrord to answer")
                ctx.log("txn", f"P={partitions}: {name}")
                row[name] = bm.mirror_run(cli, proxy.pid, bs, src, topic, partitions, a, f"txn-p{partitions}")
                dst.delete_topic(topic)
                bm.wait_until(lambda: topic not in dst.topics("--list").stdout.split(), 120, f"{topic} deleted")
                ctx.log("txn", f"P={partitions}: {name} {row[name]['seconds']:.1f} s")
            res["rows"].append(row)
            src.delete_topic(topic)
            n += 1
    finally:
        common.bm._admins.clear()
        for proxy, _ in proxies.values():
            proxy.stop(timeout=60)
        dst.stop()
        src.stop()
    return res


def _rate(r, n):
    """Transactions a second, from the first mirrored record to the last (start-up left out), and
    over the whole run."""
    st = r.get("steady")
    whole = n / r["seconds"]
    if not st or not st["records"]:
        return None, whole
    return n * st["records"] / sum(r["hw"]) / st["seconds"], whole


def _f(x, nd=1):
    return "?" if x is None else f"{x:,.{nd}f}"


def report(res, ctx):
    plan, rows = res["plan"], res["rows"]
    names = list(res["binaries"])
    out = [f"{plan['transactions']:,} source transactions per partition count, each of {res['per_partition']} "
           f"records of {res['record_bytes']} B on every partition (lz4), committed one "
           f"after the other by one transactional producer (librdkafka) into a one-broker source; the "
           f"destination is three brokers (the mirror's destination topic takes the destination's default "
           f"replication factor, 3; the ingest topic has 1; the transaction state has 3). Each partition's markers are the source's, at the source's offsets, so a partition "
           f"mirrors one transaction after another: its marker lands before the next one's data. "
           f"Mirrored = `kmirror start` to every high watermark through the proxy equal to the source's; "
           f"steady = from the first mirrored record to the last. Ingest = the same producer writing the "
           f"same transactions straight into the destination.", ""]
    if "before" in names:
        out += [f"before = kmirrord `{res['binaries']['before']}`, run on the same source topics in the same run.", ""]
    head = ["P", ":transactions"] + [h for name in names for h in (f":{name} s", f":{name} txn/s (steady)")] + \
           [":ingest txn/s", ":source producer txn/s"] + ([":kmirror / before"] if "before" in names else []) + \
           [":kmirror / ingest", "order"]
    table = []
    for r in rows:
        n = r["transactions"]
        cells, steady = [r["partitions"], f"{n:,}"], {}
        for name in names:
            s, whole = _rate(r[name], n)
            steady[name] = s or whole
            cells += [_f(r[name]["seconds"]), _f(s)]
        ingest = n / r["ingest_s"]
        cells += [_f(ingest), _f(n / r["source_s"])]
        if "before" in names:
            cells.append(f"**{_f(steady['kmirror'] / steady['before'], 1)}×**")
        cells += [f"**{_f(steady['kmirror'] / ingest, 2)}**", " → ".join(r["order"])]
        table.append(cells)
    out += [common.md_table(head, table), ""]
    return "\n".join(out)
