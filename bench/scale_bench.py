"""Cost against data size: synthetic conversations, their turn lengths drawn from ShareGPT's,
through prepare, extract, train and evaluate on the built-in tiny target at each size, one
pipeline run per size in a child process; then the same command again, every stage finished
(what a resumed run pays before it works).

  recorded per size and stage: seconds, tokens, seconds per 1k tokens, each process's peak
  resident memory (anonymous, i.e. not counting the store's memory-mapped pages the kernel can
  drop; sampled every 0.2 s from /proc, by Ray process title), bytes read by every process
  (`/proc/PID/io` rchar: reads through the page cache included, memory-mapped reads not); and
  for the finished run's rerun its seconds and bytes read

    python bench/scale_bench.py OUT_DIR --sizes 1000 10000 100000 --json PATH

Serve is left out: its cost is per served prompt, not per training conversation. Training
runs one epoch; the demo target's 64-token context is not what is measured, the per-token cost
of the stages around it is (data.max_length cuts every conversation, as it would a user's).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT / "bench"))
sys.path.insert(0, str(CHECKOUT))
STAGES = ("prepare", "extract", "train", "evaluate")
# the process that does each stage's work, by its Ray title's start
WORKERS = {"prepare": "ray::prepare_task", "extract": "ray::ReplicaActor",
           "train": "ray::RayTrainWorker", "evaluate": "ray::EvaluateActor"}
# ShareGPT's turn lengths, in characters, times this: its shape kept, its tokens fewer (one
# ShareGPT conversation is ~2800 of the tiny target's tokens), so that 10^5 conversations fit
# this bench's hour on two cores
SCALE = 0.125
HELDOUT = 64  # held-out conversations, the same at every size
LENGTH_SOURCE = 4000  # ShareGPT conversations whose turn lengths are drawn from
WORDS = ("the of and to in is that for it as with was on be by this are or at from have an "
         "not which but you all they one can has more will if their there what about when "
         "so up out into than them some could would other time only then its over also new "
         "first after use two how our work any may well way even because these people most "
         "data model token layer state train draft serve engine write read value list file "
         "function return class import error number string result table memory").split()


def turn_lengths(limit: int = LENGTH_SOURCE) -> list[list[int]]:
    """Characters of every turn of ShareGPT's first `limit` usable conversations (the wheel)."""
    from eyas.conversations import sharegpt
    out = []
    for _, _, messages in sharegpt.conversations(sharegpt.ReadCounts()):
        out.append([len(m["content"]) for m in messages])
        if len(out) == limit:
            break
    return out


def synthetic(count: int, lengths: list[list[int]], seed: int, scale: float) -> list[dict]:
    """`count` conversations, each taking one ShareGPT conversation's turn lengths (drawn with
    replacement) times `scale`, filled with words drawn at random."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        turns = []
        for j, chars in enumerate(rng.choice(lengths)):
            text, size = [], 0
            while size < max(1, chars * scale):
                text.append(rng.choice(WORDS))
                size += len(text[-1]) + 1
            turns.append({"role": "user" if j % 2 == 0 else "assistant",
                          "content": " ".join(text)})
        if turns[-1]["role"] == "user":
            turns.pop()
        out.append({"messages": turns})
    return out


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _title(proc) -> str:
    """A process's role: Ray's title (ray::ReplicaActor.run_shard, ray::IDLE, ...) or its
    executable."""
    try:
        cmd = proc.cmdline()
    except Exception:
        return "?"
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    if any("workflows.pipeline" in c for c in cmd):
        return "driver"
    return Path(cmd[0]).name if cmd else "?"


def _process_counters(pid: int) -> tuple[int, int, int, int, int]:
    """(anonymous resident bytes, bytes read, user and system CPU ticks, minor page faults)."""
    rss = rchar = user = system = faults = 0
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                rss = int(line.split()[1]) * 1024
        for line in open(f"/proc/{pid}/io"):
            if line.startswith("rchar:"):
                rchar = int(line.split()[1])
        stat = open(f"/proc/{pid}/stat").read()
        fields = stat[stat.rindex(")") + 2:].split()  # after the title, which may hold spaces
        faults, user, system = int(fields[7]), int(fields[11]), int(fields[12])
    except (OSError, ValueError, IndexError):
        pass
    return rss, rchar, user, system, faults


def _free_memory() -> int:
    """MemFree: what the kernel hands out without reclaiming the page cache first."""
    for line in open("/proc/meminfo"):
        if line.startswith("MemFree:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler:
    """Every 0.2 s, each descendant of `pid`: its title, anonymous resident memory, bytes
    read, CPU time and page faults so far; and the machine's free memory. peaks(t0, t1): the
    largest memory per title in that window; read(t0, t1): the bytes read by every process in
    it; cpu(t0, t1, title): the CPU seconds (user, system) and minor faults of the processes
    whose title starts so; least_free(t0, t1): the least free memory seen."""

    def __init__(self, pid: int, every: float = 0.2):
        import psutil
        self.root, self.every = psutil.Process(pid), every
        self.samples: list[tuple[float, int, str, int, int, int, int, int]] = []
        self.free: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import psutil
        titles: dict[int, str] = {}
        while not self.stop.is_set():
            now = time.time()
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                title = _title(p)  # a Ray worker's title changes with the task it runs
                if title != "?":
                    titles[p.pid] = title
                self.samples.append((now, p.pid, titles.get(p.pid, "?"), *_process_counters(p.pid)))
            self.free.append((now, _free_memory()))
            self.stop.wait(self.every)

    def close(self):
        self.stop.set()
        self.thread.join()

    def peaks(self, t0: float, t1: float) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t, _, title, rss, *_ in self.samples:
            if t0 <= t <= t1:
                out[title] = max(out[title], rss)
        return dict(out)

    def _growth(self, t0: float, t1: float, title: str = "") -> list[int]:
        """What each counter (bytes read, user and system ticks, minor faults) grew by in the
        window, summed over the processes whose title starts with `title`."""
        first, last = {}, {}
        for t, pid, name, _, *counters in self.samples:
            if t0 <= t <= t1 and name.startswith(title):
                first.setdefault(pid, counters)
                last[pid] = counters
        return [sum(last[p][i] - first[p][i] for p in last) for i in range(4)]

    def read(self, t0: float, t1: float) -> int:
        return self._growth(t0, t1)[0]

    def cpu(self, t0: float, t1: float, title: str) -> dict:
        _, user, system, faults = self._growth(t0, t1, title)
        tick = os.sysconf("SC_CLK_TCK")
        return {"user_s": user / tick, "system_s": system / tick, "minor_faults": faults}

    def least_free(self, t0: float, t1: float) -> int | None:
        return min((free for t, free in self.free if t0 <= t <= t1), default=None)


def _window(run: Path, stage: str) -> tuple[float, float] | None:
    start, done = run / stage / "_STARTED.json", run / stage / "_COMPLETE.json"
    if not (start.exists() and done.exists()):
        return None
    return start.stat().st_mtime, done.stat().st_mtime


def _tokens(run: Path) -> dict:
    splits = json.loads((run / "prepare" / "manifest.json").read_text())["splits"]
    return {name: {"samples": s.get("samples"), "tokens": s.get("tokens")}
            for name, s in splits.items()}


def _command(data: Path, run: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "workflows.pipeline", "experiment=tiny", "data=files",
            f"data.train_files=[{data / 'train.jsonl'}]",
            f"data.heldout_files=[{data / 'heldout.jsonl'}]", f"run_dir={run}",
            f"stages=[{','.join(STAGES)}]", "train.epochs=1", "train.batch_size=16",
            "train.checkpoint_every=200",
            # eyas's default shard, not the tiny experiment's 16 (written so that its tests'
            # few samples make several shards): the cost of a shard is a user's
            "extract.samples_per_shard=256",
            "data.on_bad_record=skip",
            *overrides]


def _attempt(command: list[str], log: Path, until=None) -> tuple[int, float, float, Sampler]:
    """Run the pipeline, its output into `log`; with `until`, SIGTERM it once until() holds
    (a scheduler's stop). (exit code, start and end times, the sampler of its processes)."""
    started = time.time()
    proc = subprocess.Popen(command, cwd=CHECKOUT, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    while until is not None and proc.poll() is None and not until():
        time.sleep(0.5)
    if until is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait()
    ended = time.time()
    sampler.close()
    return code, started, ended, sampler


def run_size(out: Path, count: int, lengths, scale: float, overrides: list[str]) -> dict:
    data = out / "data" / str(count)
    write_jsonl(data / "train.jsonl", synthetic(count, lengths, count, scale))
    write_jsonl(data / "heldout.jsonl", synthetic(HELDOUT, lengths, -1, scale))
    run = out / "runs" / str(count)
    command = _command(data, run, overrides)
    result = {"conversations": count, "command": command[2:]}
    for attempt in ("run", "rerun"):
        code, started, ended, sampler = _attempt(command, out / f"{count}.{attempt}.log")
        if code:
            raise SystemExit(f"N={count} {attempt}: exit {code}; "
                             f"see {out / f'{count}.{attempt}.log'}")
        if attempt == "rerun":
            result["rerun"] = {"seconds": ended - started,
                               "bytes_read": sampler.read(started, ended),
                               "peak_anon": sampler.peaks(started, ended)}
            continue
        result["seconds"] = ended - started
        result["splits"] = _tokens(run)
        tokens = result["splits"]["train"]["tokens"]
        result["stages"] = {}
        for stage in STAGES:
            t0, t1 = _window(run, stage)
            peaks = sampler.peaks(t0, t1)
            result["stages"][stage] = {
                "seconds": t1 - t0, "s_per_1k_tokens": (t1 - t0) / tokens * 1000,
                "worker_peak_anon": max((v for k, v in peaks.items()
                                         if k.startswith(WORKERS[stage])), default=None),
                "driver_peak_anon": peaks.get("driver"),
                "peak_anon": peaks, "bytes_read": sampler.read(t0, t1),
                "worker_cpu": sampler.cpu(t0, t1, WORKERS[stage]),
                "least_free_memory": sampler.least_free(t0, t1)}
        result["store_bytes"] = sum(f.stat().st_size for f in (run / "extract").rglob("*")
                                    if f.is_file())
        print(json.dumps({k: result[k] for k in ("conversations", "seconds", "splits")}),
              flush=True)
    return result


def _finished(run: Path) -> dict[str, int]:
    """Each finished data file of the run's prepare and extract stages (not the markers a
    stage writes as it starts and ends, `_STARTED.json` and the like): its mtime (ns)."""
    return {str(f.relative_to(run)): f.stat().st_mtime_ns
            for stage in ("prepare", "extract") if (run / stage).exists()
            for f in (run / stage).rglob("*")
            if f.is_file() and not f.name.startswith((".", "_"))}


def _checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run / "train" / "checkpoints").glob("step-*"))


def resumed_size(out: Path, count: int, overrides: list[str]) -> dict:
    """The run of `count` conversations (run_size wrote its data) in a run directory of its
    own, stopped by SIGTERM halfway through extraction, run again and stopped once training
    has a checkpoint past its first, then run to the end: what each resume rewrote of the
    finished prepare and extract files, where training resumed, and what each read."""
    data, run = out / "data" / str(count), out / "runs" / f"{count}-resumed"
    command = _command(data, run, overrides)
    shards = lambda: len(list((run / "extract").glob("shard-train-*.json")))  # noqa: E731

    def half_extracted():
        manifest = run / "prepare" / "manifest.json"
        if not manifest.exists():
            return False
        samples = json.loads(manifest.read_text())["splits"]["train"]["samples"]
        return shards() >= max(1, samples // 256 // 2)

    attempts = []
    for name, until in (("stopped in extract", half_extracted),
                        ("stopped in train", lambda: len(_checkpoints(run)) >= 2),
                        ("completed", None)):
        before, checkpoints = _finished(run), _checkpoints(run)
        code, started, ended, sampler = _attempt(
            command, out / f"{count}.resumed.{len(attempts)}.log", until)
        after = _finished(run)
        attempts.append({
            "attempt": name, "exit": code, "seconds": ended - started,
            "bytes_read": sampler.read(started, ended),
            "finished_files_before": len(before),
            "finished_files_rewritten": sum(after.get(f) != t for f, t in before.items()),
            "train_shards_before": sum("shard-train-" in f and f.endswith(".json")
                                       for f in before),
            "checkpoints_before": checkpoints,
            "store_bytes_before": sum((run / f).stat().st_size for f in before
                                      if f.startswith("extract") and (run / f).exists())})
    report = json.loads((run / "train" / "train_report.json").read_text())
    return {"conversations": count, "attempts": attempts,
            "train_resumed_from": report.get("resumed_from"),
            "checkpoint_every": int([c for c in command if c.startswith(
                "train.checkpoint_every=")][-1].split("=")[1])}


def main(argv: list[str]) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the data, runs and logs")
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--scale", type=float, default=SCALE,
                   help="ShareGPT's turn lengths times this (default %(default)s)")
    p.add_argument("--json", type=Path, help="also write the record here")
    p.add_argument("--resume-size", type=int, default=10000,
                   help="the size also run stopped and resumed, in a run directory of its "
                        "own (0: none; default %(default)s)")
    p.add_argument("overrides", nargs="*", help="more pipeline overrides, e.g. mlflow=...")
    a = p.parse_args(argv)
    a.out = a.out.resolve()
    lengths = turn_lengths()
    rows = []
    for n in a.sizes:
        rows.append(run_size(a.out, n, lengths, a.scale, a.overrides))
        if n == a.resume_size:
            rows[-1]["resumed"] = resumed_size(a.out, n, a.overrides)
        (a.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(summary(rows))
    if a.json:
        from record import provenance, write
        write(a.json, rows, provenance(argv),
              {f"{r['conversations']} conversations": {
                  "conversations": r["conversations"], "overrides": a.overrides,
                  "scale": a.scale, "heldout": HELDOUT} for r in rows},
              compared=("conversations",), shared=("overrides", "scale", "heldout"))
    return rows


def summary(rows: list[dict]) -> str:
    """Per stage: seconds per 1k tokens and the worker's peak memory at each size, and the
    largest size's over the smallest's."""
    first, last = rows[0], rows[-1]
    lines = [f"sizes: {', '.join(str(r['conversations']) for r in rows)} conversations"]
    for stage in STAGES:
        a, b = first["stages"][stage], last["stages"][stage]
        lines.append(
            f"{stage:9s} s/1k tokens " + " ".join(f"{r['stages'][stage]['s_per_1k_tokens']:.4f}"
                                                  for r in rows)
            + f" ({b['s_per_1k_tokens'] / a['s_per_1k_tokens']:.2f}x); worker MiB "
            + " ".join(f"{(r['stages'][stage]['worker_peak_anon'] or 0) / 2**20:.0f}"
                       for r in rows)
            + f" ({(b['worker_peak_anon'] or 0) / max(1, a['worker_peak_anon'] or 0):.2f}x)")
    lines.append("rerun of a finished run: " + ", ".join(
        f"{r['rerun']['seconds']:.1f} s, {r['rerun']['bytes_read'] / 2**20:.0f} MiB read "
        f"(store {r['store_bytes'] / 2**20:.0f} MiB)" for r in rows))
    for r in rows:
        for at in r.get("resumed", {}).get("attempts", ()):
            lines.append(f"N={r['conversations']} {at['attempt']}: exit {at['exit']}, "
                         f"{at['seconds']:.0f} s, {at['bytes_read'] / 2**20:.0f} MiB read "
                         f"(store before {at['store_bytes_before'] / 2**20:.0f} MiB), "
                         f"{at['finished_files_rewritten']} of {at['finished_files_before']} "
                         f"finished files rewritten, checkpoints {at['checkpoints_before']}")
        if "resumed" in r:
            lines.append(f"  training resumed from step {r['resumed']['train_resumed_from']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
