"""Shell entry point of the harness: start, stop and list detached Kafka clusters (used by the demo).

  python3 -m harness start NAME [--brokers N] [--root DIR]   start (or report) a cluster
  python3 -m harness stop [NAME ...] [--root DIR] [--purge]   stop by pid from the state file
  python3 -m harness status [--root DIR] [--json]            list clusters and whether they run
  python3 -m harness tool NAME TOOL [ARGS...]               run a Kafka Java tool against NAME
  python3 -m harness sweep [--dry-run]                       delete test clusters' temporary dirs
                                                             left by killed runs (no live broker)
Clusters live in ROOT/NAME (default <repo>/.cache/clusters), each with a cluster.json state file.
"""

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile

from .kafka_cluster import (REPO, KafkaCluster, KafkaError, TOOLS, _pid_alive, _pid_cmdline,
                            kafka_version, stop_from_state, tool_class)

DEFAULT_ROOT = os.path.join(REPO, ".cache", "clusters")


def _load(root, name):
    path = os.path.join(root, name, "cluster.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _running_nodes(st):
    return [n for n in st["nodes"].values()
            if n["pid"] and _pid_alive(n["pid"]) and n["config"] in _pid_cmdline(n["pid"])]


def _names(root):
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "cluster.json")))


def cmd_start(args):
    st = _load(args.root, args.name)
    if st and _running_nodes(st):
        if len(_running_nodes(st)) == len(st["nodes"]):
            print(st["bootstrap"])
            return 0
        stop_from_state(os.path.join(args.root, args.name))
    base = os.path.join(args.root, args.name)
    shutil.rmtree(base, ignore_errors=True)
    overrides = dict(kv.split("=", 1) for kv in args.set or [])
    cluster = KafkaCluster(args.name, brokers=args.brokers, base_dir=base, overrides=overrides,
                           attached=False, keep_dir=True, release=args.release)
    try:
        cluster.start(timeout=args.timeout)
    except KafkaError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 1
    print(cluster.bootstrap)
    return 0


def cmd_stop(args):
    names = args.names or _names(args.root)
    rc = 0
    for name in names:
        base = os.path.join(args.root, name)
        if not os.path.exists(os.path.join(base, "cluster.json")):
            print(f"harness: no cluster {name} in {args.root}", file=sys.stderr)
            rc = 1
            continue
        pids = stop_from_state(base)
        print(f"{name}: stopped {len(pids)} process(es)" + (f" {pids}" if pids else ""))
        if args.purge:
            shutil.rmtree(base, ignore_errors=True)
    return rc


def cmd_status(args):
    out = []
    for name in _names(args.root):
        st = _load(args.root, name)
        running = len(_running_nodes(st))
        out.append({"name": name, "bootstrap": st["bootstrap"], "sasl_bootstrap": st["sasl_bootstrap"],
                    "brokers": st["brokers"], "running": running, "nodes": len(st["nodes"]),
                    "dir": st["base_dir"]})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    if not out:
        print(f"no clusters in {args.root}")
    for c in out:
        state = ("running" if c["running"] == c["nodes"]
                 else "stopped" if c["running"] == 0 else f"{c['running']}/{c['nodes']} nodes up")
        print(f"{c['name']:<12} {state:<10} bootstrap {c['bootstrap']}  (sasl {c['sasl_bootstrap']})"
              f"  dir {c['dir']}")
    return 0


def cmd_tool(args):
    st = _load(args.root, args.name)
    if not st:
        print(f"harness: no cluster {args.name}", file=sys.stderr)
        return 1
    os.execvp("java", ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1",
                       "-Dlog4j2.configurationFile=" + os.path.join(st["base_dir"], "tools-log4j2.properties"),
                       "-cp", os.path.join(st["libs"], "*"), tool_class(args.tool, kafka_version(st["libs"]))] + args.args)


def cmd_sweep(args):
    """Temporary cluster dirs (<tmp>/kmirror-<name>-*) whose brokers are all gone: a run that was
    SIGKILLed, or one kept with KM_KEEP_KAFKA_DIRS=1. Directories without pid files are left."""
    tmp = tempfile.gettempdir()
    removed = 0
    for d in sorted(glob.glob(os.path.join(tmp, "kmirror-*-*"))):
        pids = glob.glob(os.path.join(d, "node-*", "pid"))
        if not pids:
            continue
        alive = False
        for pf in pids:
            try:
                with open(pf) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            config = os.path.join(os.path.dirname(pf), "server.properties")
            if _pid_alive(pid) and config in _pid_cmdline(pid):
                alive = True
        if alive:
            continue
        print(("would remove " if args.dry_run else "removing ") + d)
        if not args.dry_run:
            shutil.rmtree(d, ignore_errors=True)
        removed += 1
    if not removed:
        print("nothing to sweep")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=os.environ.get("KM_CLUSTERS_DIR", DEFAULT_ROOT))
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("name")
    s.add_argument("--brokers", type=int, default=1)
    s.add_argument("--release", help="another Kafka release than the suite's, e.g. 3.9.2 or 2.8.2 "
                   "(before 3.0: on ZooKeeper)")
    s.add_argument("--timeout", type=float, default=180)
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="extra broker property")
    s = sub.add_parser("stop")
    s.add_argument("names", nargs="*")
    s.add_argument("--purge", action="store_true", help="also delete data and logs")
    s = sub.add_parser("status")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("sweep")
    s.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("tool")
    s.add_argument("name")
    s.add_argument("tool", help="one of: " + ", ".join(sorted(TOOLS)) + ", or a main class")
    s.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    return {"start": cmd_start, "stop": cmd_stop, "status": cmd_status, "tool": cmd_tool,
            "sweep": cmd_sweep}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
