"""Helpers of the data plane's exactness tests: records with keys, values, headers and timestamps
produced at the source, waiting until a mirror caught up, reading partitions through the proxy and
directly from the source and comparing them record by record (with lost / duplicated / reordered
counts), and the v2 record batches of both sides' segment files compared byte for byte."""

import collections
import os
import struct
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
FIELDS = ("offset", "key", "value", "headers", "timestamp")


def _pom_release():
    pom = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kafka", "pom.xml")
    with open(pom) as f:
        text = f.read()
    start = text.index("<kafka.version>") + len("<kafka.version>")
    return text[start:text.index("</kafka.version>", start)]


POM_RELEASE = _pom_release()
# scripts/test runs the suite a second time on an older release (KM_KAFKA_VERSION). That pass
# keeps what can differ between releases (the clients and brokers of that release through the
# proxy, transactions, failback, the swap, a representative part of the data plane); what does not
# (the harness itself, the CLI's security and lifecycle, memory bounds, state scale, the data
# plane's heavier tests, the 3-broker variants of the `cluster` tests and of test_mirror_txn) runs on the pom's release
# only, to keep CI time. KM_ALL_RELEASES=1 runs everything on every release.
ON_MAIN_RELEASE = (os.environ.get("KM_KAFKA_VERSION", POM_RELEASE) == POM_RELEASE or
                   os.environ.get("KM_ALL_RELEASES") == "1")
main_release_only = pytest.mark.skipif(
    not ON_MAIN_RELEASE, reason=f"runs on the {POM_RELEASE} release only (KM_ALL_RELEASES=1 runs it)")


def skip_3brokers_off_main_release():
    """A test's 3-broker variant (the `cluster` fixture's, test_mirror_txn's) runs on the pom's
    release only."""
    if not ON_MAIN_RELEASE:
        pytest.skip(f"3-broker variant: runs on the {POM_RELEASE} release only (KM_ALL_RELEASES=1 runs it)")


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v else default


def long_run():
    """The issue's full sizes (1,000,000 records, 10 kills): KM_LONG=1 or pytest --long."""
    return os.environ.get("KM_LONG", "") not in ("", "0")


def progress(msg):
    """A progress line that pytest's capture does not swallow with -s, and -rA shows otherwise."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
    if os.environ.get("KM_PROGRESS"):
        sys.__stderr__.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")


# ---------------------------------------------------------------------------------------------
# Records

_FILL = (b"the quick brown fox jumps over the lazy dog 0123456789 " * 200)


def record(i, tag="r"):
    """Record i of a run: (key, value, headers, timestamp or None). Deterministic, and unique by
    key or value (never both null/empty), so that content identifies a record:

    * key: None for every 9th, else text naming i;
    * value: empty for every 13th with a key, sizes 1..~600 bytes, every 97th 5..9 KB;
    * headers: 0 to 4 (i % 5), with an empty value, a null value and a repeated key among them;
    * timestamp: every 50th an explicit one an hour back (not monotonic in the batch), else the
      producer's clock."""
    key = None if i % 9 == 4 else f"{tag}-key-{i}".encode()
    if key is not None and i % 13 == 6:
        value = b""
    else:
        size = 5000 + (i * 31) % 4000 if i % 97 == 0 else (i * 7919) % 600
        head = f"{tag}-value-{i}:".encode()
        value = head + _FILL[(i % 50):(i % 50) + max(size - len(head), 0)]
    nh = i % 5
    headers = [("idx", str(i).encode()), ("empty", b""), ("nullv", None), ("dup", b"one"),
               ("dup", b"two-" + str(i % 7).encode())][:nh]
    ts = None
    if i % 50 == 0:
        ts = int(time.time() * 1000) - 3_600_000 + (i % 1000)
    return key, value, headers, ts


def producer_conf(bootstrap, compression="none", **extra):
    c = {"bootstrap.servers": bootstrap, "compression.type": compression, "acks": "all",
         "linger.ms": 20, "batch.num.messages": 1000, "queue.buffering.max.messages": 200000,
         "message.timeout.ms": 120000}
    c.update(extra)
    return c


def produce_records(bootstrap, topic, n, compression="none", start=0, tag="r", partitions=None,
                    **extra):
    """Produces records start..start+n-1 to topic (partitioned by key; null keys spread by
    librdkafka, or round robin over `partitions` when given); returns the number acked, failing
    on any delivery error."""
    p = Producer(producer_conf(bootstrap, compression, **extra))
    errors = []
    acked = [0]

    def cb(err, msg):
        if err:
            errors.append(err)
        else:
            acked[0] += 1

    for i in range(start, start + n):
        key, value, headers, ts = record(i, tag)
        kw = {"key": key, "value": value, "headers": headers, "on_delivery": cb}
        if ts is not None:
            kw["timestamp"] = ts
        if partitions:
            kw["partition"] = i % partitions
        while True:
            try:
                p.produce(topic, **kw)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    assert left == 0, f"{left} records not delivered to {topic}"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[0]}"
    return acked[0]


class BackgroundProducer:
    """Keeps producing records (tag, numbered from start) to a topic from a thread until stop();
    idempotent, so the source itself holds every record exactly once."""

    def __init__(self, bootstrap, topic, compression="lz4", tag="bg", rate=5000, start=0):
        self.bootstrap, self.topic, self.compression, self.tag = bootstrap, topic, compression, tag
        self.rate = rate
        self.next = start
        self.acked = 0
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        p = Producer(producer_conf(self.bootstrap, self.compression, **{"enable.idempotence": True}))

        def cb(err, msg):
            if err:
                self.errors.append(err)
            else:
                self.acked += 1

        t0 = time.monotonic()
        while not self._stop.is_set():
            # Paced: about `rate` records a second, in bursts of 100.
            for _ in range(100):
                key, value, headers, ts = record(self.next, self.tag)
                kw = {"key": key, "value": value, "headers": headers, "on_delivery": cb}
                if ts is not None:
                    kw["timestamp"] = ts
                try:
                    p.produce(self.topic, **kw)
                    self.next += 1
                except BufferError:
                    break
            p.poll(0)
            ahead = self.next / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(min(ahead, 0.2))
        p.flush(120)

    def stop(self):
        self._stop.set()
        self._thread.join(180)
        assert not self.errors, f"{len(self.errors)} delivery errors, first: {self.errors[0]}"
        return self.next


# ---------------------------------------------------------------------------------------------
# Offsets

def _consumer(bootstrap, **extra):
    c = {"bootstrap.servers": bootstrap, "group.id": f"exact-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False, "enable.partition.eof": True,
         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}
    c.update(extra)
    return Consumer(c)


def watermarks(bootstrap, topic, partitions, timeout=15, **extra):
    """[(low, high)] per partition, asked of the brokers (not cached). The high mark is the last
    stable offset under librdkafka's default isolation (read_committed); extra may say otherwise."""
    c = _consumer(bootstrap, **extra)
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                for p in range(partitions)]
    finally:
        c.close()


def offsets_for_times(bootstrap, topic, partitions, stamps, timeout=15, **extra):
    """{timestamp: [offset per partition]}: ListOffsets by timestamp (offsets_for_times), one
    request per timestamp for all partitions; -1 where no record is that late."""
    c = _consumer(bootstrap, **extra)
    try:
        return {ts: [tp.offset for tp in c.offsets_for_times(
            [TopicPartition(topic, p, ts) for p in range(partitions)], timeout=timeout)]
            for ts in stamps}
    finally:
        c.close()


def wait_caught_up(proxy_bootstrap, source_bootstrap, topic, partitions, timeout=300,
                   stall=60, describe=None):
    """Waits until every partition's high watermark through the proxy equals the source's (asked
    again each round, so a source still written to is followed). Prints a progress line every few
    seconds; fails after `timeout` seconds, or `stall` seconds without progress (a mirror that
    does not move: nothing to wait for), naming what is behind and what describe says. Returns
    the source's watermarks at the moment both sides were equal."""
    t0 = time.monotonic()
    last_progress, last_line, last_total = t0, 0.0, None
    while True:
        src = watermarks(source_bootstrap, topic, partitions)
        try:
            dst = watermarks(proxy_bootstrap, topic, partitions)
        except Exception as e:  # noqa: BLE001 - the proxy restarting; counted as no progress
            dst = [(None, None)] * partitions
            err = e
        else:
            err = None
        if all(d[1] == s[1] for d, s in zip(dst, src)):
            progress(f"{topic}: caught up, {sum(s[1] - s[0] for s in src)} records in "
                     f"{partitions} partitions after {time.monotonic() - t0:.1f}s")
            return src
        total = sum(d[1] or 0 for d in dst)
        now = time.monotonic()
        if total != last_total:
            last_total, last_progress = total, now
        if now - last_line > 5:
            last_line = now
            progress(f"{topic}: proxy high watermarks {total} of the source's "
                     f"{sum(s[1] for s in src)} ({now - t0:.0f}s){f'; {err}' if err else ''}")
        if now - t0 > timeout or now - last_progress > stall:
            behind = [f"p{p}: proxy {d[1]} source {s[1]}" for p, (d, s) in enumerate(zip(dst, src))
                      if d[1] != s[1]]
            extra = ""
            if describe is not None:
                try:
                    extra = f"\ndescribe: {describe()}"
                except Exception as e:  # noqa: BLE001
                    extra = f"\ndescribe failed: {e}"
            why = "no progress for %ds" % stall if now - last_progress > stall else "timed out"
            raise AssertionError(f"mirror of {topic} not caught up ({why} after "
                                 f"{now - t0:.0f}s): {', '.join(behind)}{extra}")
        time.sleep(1.0)


# ---------------------------------------------------------------------------------------------
# Reading and comparing

Rec = collections.namedtuple("Rec", FIELDS)


def read_partition(bootstrap, topic, partition, start, end, timeout=180, **extra):
    """Every record of topic-partition with start <= offset < end, as Recs in the order read
    (duplicates and disorder kept: the comparison counts them). Reads until the partition's end
    (EOF at or past `end`) so a record too many at the end is seen too."""
    out = []
    if end <= start:
        return out
    c = _consumer(bootstrap, **extra)
    c.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}-{partition} [{start}, {end}) from "
                                     f"{bootstrap}: {len(out)} records after {timeout}s")
            done = False
            for m in c.consume(num_messages=10000, timeout=0.1):
                e = m.error()
                if e is not None:
                    if e.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:
                            done = True
                        continue
                    raise AssertionError(f"reading {topic}-{partition} from {bootstrap}: {e}")
                if m.offset() < end:
                    hs = m.headers()
                    out.append(Rec(m.offset(), m.key(), m.value(),
                                   tuple(hs) if hs else (), m.timestamp()))
            if done:
                return out
    finally:
        c.close()


def _fp(r):
    """A record's identity by content (what the source wrote), offset left out."""
    return (r.key, r.value, r.headers, r.timestamp)


def count_anomalies(src, dst):
    """How the records read through the proxy (dst) differ from the source's (src), by content:
    lost (in src, not in dst), duplicated (more copies in dst than in src), foreign (in dst, never
    in src), reordered (dst records out of the source's order: len minus the longest increasing
    run of source positions) and moved (same content at another offset)."""
    pos = {}
    for i, r in enumerate(src):
        pos.setdefault(_fp(r), []).append(i)
    srccount = collections.Counter(_fp(r) for r in src)
    dstcount = collections.Counter(_fp(r) for r in dst)
    lost = sum(max(0, n - dstcount.get(k, 0)) for k, n in srccount.items())
    dup = sum(max(0, n - srccount[k]) for k, n in dstcount.items() if k in srccount)
    foreign = sum(n for k, n in dstcount.items() if k not in srccount)
    # Source positions of dst's records (each source copy used once), then the longest
    # increasing subsequence (patience): what is not in it was reordered.
    used = collections.Counter()
    seq = []
    moved = 0
    for r in dst:
        k = _fp(r)
        lst = pos.get(k)
        if not lst or used[k] >= len(lst):
            continue
        i = lst[used[k]]
        used[k] += 1
        seq.append(i)
        if src[i].offset != r.offset:
            moved += 1
    import bisect
    tails = []
    for v in seq:
        j = bisect.bisect_left(tails, v)
        if j == len(tails):
            tails.append(v)
        else:
            tails[j] = v
    return {"lost": lost, "duplicated": dup, "foreign": foreign,
            "reordered": len(seq) - len(tails), "moved": moved}


def diff_records(src, dst):
    """Record-by-record comparison by position: (number of positions that differ, description of
    the first one)."""
    ndiff, first = 0, None
    for i in range(max(len(src), len(dst))):
        a = src[i] if i < len(src) else None
        b = dst[i] if i < len(dst) else None
        if a == b:
            continue
        ndiff += 1
        if first is None:
            if a is None or b is None:
                first = f"record #{i}: source {_short(a)} proxy {_short(b)}"
            else:
                fields = [f for f in FIELDS if getattr(a, f) != getattr(b, f)]
                first = (f"record #{i} (source offset {a.offset}): " + "; ".join(
                    f"{f}: source {_short(getattr(a, f))} proxy {_short(getattr(b, f))}"
                    for f in fields))
    return ndiff, first


def _short(v, n=80):
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


def compare_partition(proxy_bootstrap, source_bootstrap, topic, partition, start, end,
                      check=True, proxy_conf=None):
    """Reads [start, end) of a partition through the proxy and from the source and compares them;
    returns (records compared, anomaly counts). With check, fails naming the first differing
    record, how many differ, and the counts. proxy_conf: client settings for the proxy (SASL)."""
    src = read_partition(source_bootstrap, topic, partition, start, end)
    dst = read_partition(proxy_bootstrap, topic, partition, start, end, **(proxy_conf or {}))
    counts = count_anomalies(src, dst)
    ndiff, first = diff_records(src, dst)
    counts["differ"] = ndiff
    if check:
        assert ndiff == 0, (f"{topic}-{partition} [{start}, {end}): {ndiff} of {len(src)} "
                            f"source records differ through the proxy (proxy read {len(dst)}); "
                            f"first: {first}; counts {counts}")
    return len(src), counts


def compare_topic(proxy_bootstrap, source_bootstrap, topic, partitions, marks=None, check=True,
                  proxy_conf=None):
    """compare_partition over every partition, from the source's low to high watermark (or the
    given marks); returns (total records, summed counts). Every partition is compared before
    failing, so the message covers them all."""
    marks = marks or watermarks(source_bootstrap, topic, partitions)
    total = 0
    sums = collections.Counter()
    failures = []
    for p, (lo, hi) in enumerate(marks):
        try:
            n, counts = compare_partition(proxy_bootstrap, source_bootstrap, topic, p, lo, hi,
                                          check=check, proxy_conf=proxy_conf)
        except AssertionError as e:
            failures.append(str(e))
            continue
        total += n
        sums.update(counts)
    assert not failures, "\n".join(failures)
    return total, dict(sums)


# ---------------------------------------------------------------------------------------------
# Segment files

def parse_batches(data):
    """Every complete v2 batch of a segment file's bytes, with its records section (byte 61 to
    the end); stops at a batch not yet written out (the file is in use)."""
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        if length < 49 or pos + 12 + length > len(data):
            break
        (epoch, magic, crc, attrs, lod, first_ts, max_ts, pid, pepoch, seq,
         count) = struct.unpack_from(">ibIhiqqqhii", data, pos + 12)
        assert magic == 2, f"batch at file position {pos}: magic {magic}"
        out.append({"base": base, "epoch": epoch, "lod": lod, "count": count, "attrs": attrs,
                    "codec": attrs & 7, "control": bool(attrs & 0x20),
                    "txn": bool(attrs & 0x10), "log_append": bool(attrs & 0x08),
                    "first_ts": first_ts, "max_ts": max_ts, "pid": pid, "pepoch": pepoch, "seq": seq,
                    "records": data[pos + 61:pos + 12 + length]})
        pos += 12 + length
    return out


def log_dir_batches(path):
    """The batches of every segment of one partition directory, in offset order."""
    segs = sorted(f for f in os.listdir(path) if f.endswith(".log"))
    out = []
    for s in segs:
        with open(os.path.join(path, s), "rb") as f:
            out.extend(parse_batches(f.read()))
    return out


def partition_batches(cluster, topic, partition):
    dirs = cluster.partition_dirs(topic, partition)
    assert dirs, f"no replica of {topic}-{partition} on disk of {cluster.name}"
    return log_dir_batches(dirs[0])


BATCH_FIELDS = ("count", "lod", "codec", "first_ts", "max_ts")


def compare_batches(src, dst, shift=None, start=None, end=None, fields=BATCH_FIELDS):
    """Checks every destination batch against the source batch holding the same logical records:
    the records section (compressed payload) byte for byte, records count, lastOffsetDelta, codec
    bits, base and max timestamps. logical = physical + shift; with shift None, one run from the
    first destination batch to the first source batch at or past `start`. Also every source data
    batch in [start, end) must be in the destination. Returns a list of problems (empty: exact)."""
    src = [b for b in src if not b["control"] and b["count"] > 0]
    if start is not None:
        src = [b for b in src if b["base"] >= start]
    if end is not None:
        src = [b for b in src if b["base"] < end]
    if shift is None:
        if not dst or not src:
            return ([] if len(src) == len(dst) else
                    [f"{len(src)} source batches, {len(dst)} destination batches"])
        shift = src[0]["base"] - dst[0]["base"]
    by_base = {b["base"]: b for b in src}
    problems = []
    seen = set()
    for d in dst:
        logical = d["base"] + shift
        s = by_base.get(logical)
        if s is None:
            problems.append(f"destination batch at {d['base']} (logical {logical}, {d['count']} "
                            f"records): no source batch starts there")
            continue
        seen.add(logical)
        for f in fields:
            if d[f] != s[f]:
                problems.append(f"batch at logical {logical}: {f} destination {d[f]} source {s[f]}")
        if d["records"] != s["records"]:
            n = min(len(d["records"]), len(s["records"]))
            at = next((i for i in range(n) if d["records"][i] != s["records"][i]), n)
            problems.append(f"batch at logical {logical}: records bytes differ (destination "
                            f"{len(d['records'])} bytes, source {len(s['records'])}, first "
                            f"difference at byte {61 + at})")
    missing = [b["base"] for b in src if b["base"] not in seen]
    if missing:
        problems.append(f"{len(missing)} source batches not in the destination, first at offset "
                        f"{missing[0]}")
    return problems


def assert_segments_exact(source_cluster, dest_cluster, topic, partitions, shift=None,
                          fields=BATCH_FIELDS):
    """compare_batches for every partition, from the files; returns (batches, bytes) checked."""
    problems = []
    nb = nbytes = 0
    codecs = collections.Counter()
    for p in range(partitions):
        src = partition_batches(source_cluster, topic, p)
        dst = partition_batches(dest_cluster, topic, p)
        got = compare_batches(src, dst, shift=shift, fields=fields)
        problems += [f"{topic}-{p}: {x}" for x in got[:5]]
        if len(got) > 5:
            problems.append(f"{topic}-{p}: ... {len(got) - 5} more")
        nb += len(dst)
        nbytes += sum(len(b["records"]) for b in dst)
        codecs.update(CODECS.get(b["codec"], str(b["codec"])) for b in dst)
    assert not problems, "segment files differ:\n" + "\n".join(problems)
    progress(f"{topic}: {nb} destination batches ({nbytes} record bytes, codecs {dict(codecs)}) "
             f"equal to the source's on disk")
    return nb, nbytes


def shifted_copy(batches, by):
    """The batches with base offsets moved by `by` (a deliberately shifted copy for self-tests)."""
    return [dict(b, base=b["base"] + by) for b in batches]


# ---------------------------------------------------------------------------------------------
# Destination topics

def create_dest_topic(dest_cluster, source_bootstrap, topic, config=None):
    """Until `kmirror start` creates the destination topic itself: the topic on the destination,
    with the source's partition count. The one place to drop when start does it."""
    c = _consumer(source_bootstrap)
    try:
        md = c.list_topics(topic, timeout=15)
    finally:
        c.close()
    parts = len(md.topics[topic].partitions)
    assert parts > 0, f"source topic {topic} has no partitions"
    dest_cluster.create_topic(topic, partitions=parts, config=config)
    return parts


def skip_unless(cond, why):
    if not cond:
        pytest.skip(why)
