#!/usr/bin/env python3
"""A recording TCP relay between Kafka clients and one broker: every request and response frame is
written to a file, for the codec tests' golden data.

Only the request header's fixed part is parsed (int32 size, int16 api key, int16 api version,
int32 correlation id); a response is matched to its request by correlation id on the same
connection (requests without a response, Produce with acks=0, are skipped over). Files are
<NNNN>-<apikey>-v<ver>-req.bin and -resp.bin (the frame without its 4-byte size prefix), NNNN a
sequence number per recording, and index.tsv lists them.

For a broker's clients to stay on the relay, the broker must advertise the relay's address (the
harness's advertise= option). Library use: Relay(upstream).start() in a background thread,
record(dir) / stop_recording() around each session. Shell use:
  capture.py --upstream 127.0.0.1:9092 --listen 19092 --out DIR
"""

import argparse
import asyncio
import os
import struct
import threading

MAX_FRAME = 64 << 20


class Recording:
    """One output directory: numbered frame files and the rows of its index."""

    def __init__(self, out_dir, label=None):
        self.out_dir = out_dir
        self.label = label or os.path.basename(out_dir.rstrip("/"))
        os.makedirs(out_dir, exist_ok=True)
        self.seq = 0
        self.rows = []  # (file, api_key, api_version, correlation_id, direction, connection)
        self.bytes = 0
        self.lock = threading.Lock()

    def next_seq(self):
        with self.lock:
            self.seq += 1
            return self.seq

    def write(self, seq, key, ver, corr, direction, conn, frame):
        name = f"{seq:04d}-{key}-v{ver}-{direction}.bin"
        with open(os.path.join(self.out_dir, name), "wb") as f:
            f.write(frame)
        with self.lock:
            self.rows.append((name, key, ver, corr, direction, conn))
            self.bytes += len(frame)

    def close(self):
        with self.lock:
            rows = sorted(self.rows)
        with open(os.path.join(self.out_dir, "index.tsv"), "w") as f:
            f.write("file\tapi_key\tapi_version\tcorrelation_id\tdirection\tconnection\n")
            for r in rows:
                f.write("\t".join(str(x) for x in r) + "\n")
        return rows


class Relay:
    """Listens on 127.0.0.1:listen_port (0: any free port) and relays to upstream, a (host, port)
    or a callable returning one (looked up per connection: a broker's port may change)."""

    def __init__(self, upstream, listen_port=0, host="127.0.0.1"):
        self.upstream = upstream
        self.host = host
        self.port = listen_port
        self.recording = None
        self.loop = None
        self.server = None
        self.thread = None
        self._conn_seq = 0
        self._ready = threading.Event()

    # -- control (any thread) -------------------------------------------------------------------

    def record(self, out_dir, label=None):
        self.recording = Recording(out_dir, label)
        return self.recording

    def stop_recording(self):
        rec, self.recording = self.recording, None
        return rec.close() if rec else []

    def start(self):
        """Runs the relay's event loop in a daemon thread; returns once it listens."""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(10)
        return self

    def stop(self):
        if self.loop:
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread:
            self.thread.join(5)

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    # -- the loop ------------------------------------------------------------------------------

    def _run(self):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, self.host, self.port))
        self.port = self.server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.server.close()
            self.loop.close()

    async def _client(self, creader, cwriter):
        self._conn_seq += 1
        conn = self._conn_seq
        try:
            upstream = self.upstream() if callable(self.upstream) else self.upstream
            ureader, uwriter = await asyncio.open_connection(*upstream)
        except OSError:
            cwriter.close()
            return
        pending = []  # (seq, key, ver, corr, recording) in request order
        t1 = asyncio.ensure_future(self._pump(creader, uwriter, conn, pending, True))
        t2 = asyncio.ensure_future(self._pump(ureader, cwriter, conn, pending, False))
        await asyncio.wait([t1, t2], return_when=asyncio.FIRST_COMPLETED)
        for t in (t1, t2):
            t.cancel()
        for w in (cwriter, uwriter):
            try:
                w.close()
            except Exception:
                pass

    async def _pump(self, reader, writer, conn, pending, is_request):
        try:
            while True:
                head = await reader.readexactly(4)
                (size,) = struct.unpack(">i", head)
                if size < 4 or size > MAX_FRAME:
                    return  # not Kafka framing (e.g. TLS): give up on this connection
                frame = await reader.readexactly(size)
                self._note(frame, conn, pending, is_request)
                writer.write(head + frame)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return

    def _note(self, frame, conn, pending, is_request):
        rec = self.recording
        if is_request:
            if len(frame) < 8:
                return
            key, ver, corr = struct.unpack_from(">hhi", frame)
            if rec is None:
                pending.append((None, key, ver, corr, None))
                return
            seq = rec.next_seq()
            rec.write(seq, key, ver, corr, "req", conn, frame)
            pending.append((seq, key, ver, corr, rec))
            return
        (corr,) = struct.unpack_from(">i", frame)
        # Responses come in request order; requests skipped over had none (acks=0).
        while pending:
            seq, key, ver, pcorr, prec = pending.pop(0)
            if pcorr == corr:
                if prec is not None:
                    prec.write(seq, key, ver, corr, "resp", conn, frame)
                return


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="broker host:port")
    p.add_argument("--listen", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    host, port = a.upstream.rsplit(":", 1)
    relay = Relay((host, int(port)), a.listen)
    relay.record(a.out)
    relay.start()
    print(f"relaying {relay.address} -> {a.upstream}, recording to {a.out}; Ctrl-C ends",
          flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    rows = relay.stop_recording()
    relay.stop()
    print(f"{len(rows)} frames")


if __name__ == "__main__":
    main()
