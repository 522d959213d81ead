#!/usr/bin/env python3
"""Reads one sx trace file (Chrome trace-event JSON) with the standard library's json
module, checks what Perfetto and chrome://tracing need of it, and prints a summary (which
sx's own trace tests assert on). Installed with the Python package as the command
``sx-trace-summary TRACE.json`` (or ``python -m sx.trace_summary TRACE.json``):

    pid P
    events N            complete ("X") events
    dropped D           otherData.dropped_events
    capacity C
    range FIRST LAST    earliest ts and latest ts + dur, microseconds
    thread TID NAME     one per thread_name metadata event
    span NAME COUNT units=U,... bytes=B,...   (distinct values, sorted; "-" if none)

Exits 1, saying why, if the file is not JSON, lacks a field, mixes pids, or has two
spans on one thread that overlap without nesting (which Perfetto does not display).
"""
import json
import sys


def fail(msg):
    print("trace_summary: " + msg, file=sys.stderr)
    sys.exit(1)


def main(path):
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            fail("%s is not JSON: %s" % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("%s has no traceEvents array" % path)
    other = doc.get("otherData", {})
    for key in ("rank", "world_size", "capacity", "dropped_events", "events"):
        if not isinstance(other.get(key), int):
            fail("%s: otherData.%s is missing or not an integer" % (path, key))
    pids = set()
    threads = {}
    spans = {}
    by_tid = {}
    first, last = None, None
    count = 0
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if ph not in ("X", "M"):
            fail("%s: an event has ph %r" % (path, ph))
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            fail("%s: an event has no integer pid and tid: %r" % (path, e))
        pids.add(e["pid"])
        if ph == "M":
            if e.get("name") == "thread_name":
                threads[e["tid"]] = e["args"]["name"]
            continue
        count += 1
        for key in ("name", "cat", "ts", "dur", "args"):
            if key not in e:
                fail("%s: a complete event lacks %s: %r" % (path, key, e))
        if e["dur"] < 0:
            fail("%s: event %s has a negative duration" % (path, e["name"]))
        if e["tid"] not in threads and e["tid"] not in by_tid:
            by_tid[e["tid"]] = []
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        first = e["ts"] if first is None else min(first, e["ts"])
        last = e["ts"] + e["dur"] if last is None else max(last, e["ts"] + e["dur"])
        s = spans.setdefault(e["name"], [0, set(), set()])
        s[0] += 1
        if "unit" in e["args"]:
            s[1].add(e["args"]["unit"])
        if "bytes" in e["args"]:
            s[2].add(e["args"]["bytes"])
    if len(pids) != 1:
        fail("%s: events of %d pids (%s), one expected" % (path, len(pids), sorted(pids)))
    if count != other["events"]:
        fail("%s: %d complete events, otherData.events says %d" % (path, count, other["events"]))
    for tid, evs in by_tid.items():
        if tid not in threads:
            fail("%s: thread %d has events but no thread_name" % (path, tid))
        # Perfectly nested or disjoint: a stack of open spans, by start (longest first).
        evs.sort(key=lambda v: (v[0], -v[1]))
        stack = []
        for b, e, name in evs:
            while stack and stack[-1][1] <= b:
                stack.pop()
            if stack and e > stack[-1][1]:
                fail("%s: on thread %d, %s [%f, %f) overlaps %s [%f, %f) without nesting"
                     % (path, tid, name, b, e, stack[-1][2], stack[-1][0], stack[-1][1]))
            stack.append((b, e, name))
    print("pid %d" % pids.pop())
    print("events %d" % count)
    print("dropped %d" % other["dropped_events"])
    print("capacity %d" % other["capacity"])
    if first is not None:
        print("range %.3f %.3f" % (first, last))
    for tid, name in sorted(threads.items()):
        print("thread %d %s" % (tid, name))
    for name, (n, units, nbytes) in sorted(spans.items()):
        u = ",".join(str(v) for v in sorted(units)) or "-"
        b = ",".join(str(v) for v in sorted(nbytes)) or "-"
        print("span %s %d units=%s bytes=%s" % (name, n, u, b))


def cli():
    """The command: sx-trace-summary TRACE.json."""
    if len(sys.argv) != 2:
        fail("usage: sx-trace-summary TRACE.json")
    main(sys.argv[1])


if __name__ == "__main__":
    cli()
