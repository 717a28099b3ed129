#!/usr/bin/env python3
"""sched_trace.py: where a run's cores idle, and which woken ranks take a core at once.

Reads `perf sched script` output on stdin (a trace of `perf sched record -- dist run ...`) and
follows the threads named `caf.actor` (the ranks' threads, and the actor system's own). Over the middle of the trace (from
30% to 95% of it, past the start-up) it splits each core's time into: a rank's thread running,
another thread running, and idle, the idle by why: a rank's thread was queued at the other core,
a rank's thread was waking for it (between its waking and its first run), or no rank's thread
was runnable. Then, of the wakings of a rank's thread while every core ran something, how many
took a core at once from a running rank's thread (a switch away from it, still runnable, within
200 us of the waking) and how many waited, by how long the woken thread had slept and how long
its last turn on a core had lasted.

Usage: perf sched script -i perf.data | bench/sched_trace.py [--cores N]
"""
import argparse
import collections
import re
import statistics
import sys

SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=(.*?) prev_pid=(\d+) "
                    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
WAKING = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_waking: comm=(.*?) pid=(\d+) "
                    r"prio=\d+ target_cpu=(\d+)")
RANK = "caf.actor"
AT_ONCE = 200e-6  # a switch this soon after the waking, away from a runnable rank, took its core
STALE = 0.02  # a waking not followed by a run this long: not counted as one in progress


def events(lines):
    """(time, kind, fields) in time order: kind 's' (cpu, prev, prev_comm, prev_state, next,
    next_comm) or 'w' (cpu, pid, comm, target_cpu)."""
    out = []
    for line in lines:
        m = SWITCH.search(line)
        if m:
            out.append((float(m[2]), "s", (int(m[1]), int(m[4]), m[3], m[5], int(m[7]), m[6])))
            continue
        m = WAKING.search(line)
        if m:
            out.append((float(m[2]), "w", (int(m[1]), int(m[4]), m[3], int(m[5]))))
    out.sort(key=lambda e: e[0])
    return out


def share(counter, key):
    total = sum(counter.values())
    return 100.0 * counter[key] / total if total else 0.0


def binned(rows, edges, label):
    counts = collections.defaultdict(lambda: [0, 0])
    for x, took in rows:
        for i in range(len(edges) - 1):
            if edges[i] <= x < edges[i + 1]:
                counts[i][1 if took else 0] += 1
    for i in range(len(edges) - 1):
        waited, took = counts[i]
        n = waited + took
        if n:
            hi = "" if edges[i + 1] >= 1 else "-%.0f" % (1e6 * edges[i + 1])
            print("  %s %.0f%s us: %d wakings, %.0f%% took a core at once"
                  % (label, 1e6 * edges[i], hi if hi else "+", n, 100.0 * took / n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cores", type=int, default=0, help="cores traced (default: those seen)")
    args = ap.parse_args()
    ev = events(sys.stdin)
    if not ev:
        sys.exit("sched_trace.py: no sched_switch or sched_waking events on stdin")
    cpus = sorted({e[2][0] for e in ev if e[1] == "s"})
    if args.cores:
        cpus = list(range(args.cores))
    t0, t1 = ev[0][0], ev[-1][0]
    lo, hi = t0 + 0.3 * (t1 - t0), t1 - 0.05 * (t1 - t0)

    running = {c: 0 for c in cpus}      # cpu -> pid on it (0: idle)
    since = {c: t0 for c in cpus}       # cpu -> when that pid went on it
    queued = {}                         # rank pid -> cpu whose queue holds it
    waking = {}                         # rank pid -> (time, every core ran something)
    slept_at, last_turn, turn_began = {}, {}, {}
    pending = {}                        # rank pid -> (slept, last turn, waking time)
    where = collections.Counter()
    ranks = set()
    by_sleep, by_turn, latency = [], [], collections.defaultdict(list)
    last = None

    def account(dt, t_now):
        for c in cpus:
            pid = running.get(c, 0)
            if pid:
                where["a rank's thread ran" if pid in ranks else "another thread ran"] += dt
            elif any(q != c for q in queued.values()):
                where["idle, a rank's thread queued at another core"] += dt
            elif any(t_now - w < STALE for w in waking.values()):
                where["idle, a rank's thread waking"] += dt
            else:
                where["idle, no rank's thread runnable"] += dt

    for t, kind, f in ev:
        if last is not None and t > lo and last < hi:
            account(min(t, hi) - max(last, lo), t)
        last = t
        if kind == "s":
            c, prev, prev_comm, state, nxt, nxt_comm = f
            if prev_comm == RANK:
                ranks.add(prev)
                if prev in turn_began:
                    last_turn[prev] = t - turn_began[prev]
                # A waking of a thread that was still on its core ends here: no run follows it.
                waking.pop(prev, None)
                pending.pop(prev, None)
                if state.startswith("R"):
                    queued[prev] = c
                else:
                    queued.pop(prev, None)
                    slept_at[prev] = t
            if nxt_comm == RANK:
                ranks.add(nxt)
                queued.pop(nxt, None)
                turn_began[nxt] = t
                w = waking.pop(nxt, None)
                p = pending.pop(nxt, None)
                if p is not None and lo <= t <= hi:
                    slept, turn, at = p
                    took = (prev_comm == RANK and state.startswith("R") and t - at < AT_ONCE)
                    by_sleep.append((slept, took))
                    by_turn.append((turn, took))
                    latency["took a core at once" if took else "waited"].append(t - at)
            running[c], since[c] = nxt, t
        else:
            c, pid, comm, target = f
            if comm != RANK:
                continue
            ranks.add(pid)
            # The kernel reports wakings of a thread still on a core or still in a queue too:
            # only a sleeping thread's waking is one.
            if pid in running.values() or pid in queued:
                continue
            waking[pid] = t
            if all(running.get(k, 0) for k in cpus) and pid in slept_at:
                pending[pid] = (t - slept_at[pid], last_turn.get(pid, 0.0), t)
            else:
                pending.pop(pid, None)

    if not ranks:
        sys.exit("sched_trace.py: no thread named %s in the trace: not a trace of `dist run`" % RANK)
    span = hi - lo
    print("window: %.2f s of %d cores, %d rank threads" % (span, len(cpus), len(ranks)))
    for key in ("a rank's thread ran", "another thread ran",
                "idle, a rank's thread queued at another core", "idle, a rank's thread waking",
                "idle, no rank's thread runnable"):
        print("  %-46s %5.1f%% of the cores' time" % (key, share(where, key)))
    n = sum(len(v) for v in latency.values())
    print("wakings of a rank's thread while every core ran: %d" % n)
    for key, v in sorted(latency.items()):
        v = sorted(v)
        print("  %s: %d (%.0f%%), waking to running median %.0f us, mean %.0f us, 90th "
              "percentile %.0f us" % (key, len(v), 100.0 * len(v) / n, 1e6 * v[len(v) // 2],
                                      1e6 * statistics.mean(v), 1e6 * v[int(0.9 * len(v))]))
    edges = [0, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 4e-3, 8e-3, 1e9]
    print("by how long the woken thread slept:")
    binned(by_sleep, edges, "slept")
    print("by how long its last turn on a core lasted:")
    binned(by_turn, edges, "last turn")


if __name__ == "__main__":
    main()
