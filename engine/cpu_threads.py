"""Threads for the CPU path: compute on the cores that other processes leave free.

A decode step on the CPU is a few hundred short parallel regions, and an OpenMP team waits at
the end of each one for its slowest thread. With one thread per core, a core taken by another
process (the browser drawing the chat, a build, a second model) stalls every region until the
kernel gives our thread its time slice back: on 2 cores with one kept busy, decode fell to a
fraction of its quiet speed. So the engine counts how much of its allowed cores *other*
processes use (``/proc/stat`` minus the CPU time of this process group, over the last few seconds) and
computes with the rest; a sampler thread keeps the count current, and the compute thread applies
it before each step (``torch.set_num_threads`` acts on the calling thread's OpenMP team).

Linux only (``/proc/stat``); elsewhere, or with a thread count fixed by ``--cpu-threads`` or
``OMP_NUM_THREADS``, the count never changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

import torch

logger = logging.getLogger("minisgl.engine")

SAMPLE_EVERY_S = 0.25  # how often the sampler reads the CPU counters
WINDOW_S = 2.0  # the load that decides is the average over this long
# A core counts as taken when other processes use more than TAKEN_SHARE of one, and as free
# again below FREED_SHARE (the gap keeps the count from flapping). Measured on 2 cores with the
# demo model (the C kernels, 256 greedy tokens in-process) and a process busy a share f of one
# core in 5 ms bursts: f = 0.2: 2 threads 131.7 tok/s, 1 thread 110.1; f = 0.35: 106.9 / 104.8;
# f = 0.5: 90.9 / 110.0; f = 0.7: 80.7 / 108.5 -- the team of two loses the burst at every barrier.
TAKEN_SHARE = 0.4
FREED_SHARE = 0.3


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one moment: busy on the allowed cores, and this process group's own."""

    at: float
    busy_s: float
    own_s: float


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def read_sample(cpus: list[int]) -> CpuSample | None:
    """Busy seconds of ``cpus`` from /proc/stat (user, nice, system, irq, softirq, steal) and
    the CPU seconds of this process group (``group_cpu_seconds``); None where /proc/stat cannot
    be read."""
    wanted = {f"cpu{c}" for c in cpus}
    busy_ticks = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if name in wanted:
                    v = [int(x) for x in rest.split()]
                    busy_ticks += v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(time.monotonic(), busy_ticks / os.sysconf("SC_CLK_TCK"), group_cpu_seconds())


def group_cpu_seconds() -> float:
    """CPU seconds of every process in this process group: this one and, in the app, its front
    end, tokenizer and detokenizer (the launcher keeps them in one group). Their work follows
    our tokens and mostly runs between our steps, so it does not count against our cores:
    counted as other processes', the chat page's own streaming took the engine down to one
    thread (served API 139 tok/s, against 168 with two threads fixed; the page 97 against 110)."""
    group, ticks = os.getpgrp(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                data = stat.read()
        except OSError:  # ended meanwhile
            continue
        fields = data[
            data.rindex(b")") + 2 :
        ].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == group:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def others_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """How many cores other processes kept busy between two samples, on average."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        return 0.0
    return max(0.0, ((after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / elapsed)


def cores_taken(others: float, share: float) -> int:
    """Cores counted as taken when other processes keep ``others`` cores busy: each whole core,
    and a part core when it is more than ``share`` of one."""
    return int(others + 1 - share) if others > share else 0


def threads_for(others: float, num_cpus: int, max_threads: int, current: int | None = None) -> int:
    """Threads to compute with when other processes keep ``others`` cores busy: one per core they
    leave free. From ``current``, a core is given up past TAKEN_SHARE and taken back only below
    FREED_SHARE."""

    def clamp(n: int) -> int:
        return max(1, min(max_threads, n))

    fewer = clamp(num_cpus - cores_taken(others, TAKEN_SHARE))
    more = clamp(num_cpus - cores_taken(others, FREED_SHARE))
    if current is None or fewer < current:
        return fewer
    return max(current, more)


def fixed_thread_count(requested: int) -> int | None:
    """The thread count the user fixed (``--cpu-threads N``, else ``OMP_NUM_THREADS``), if any."""
    if requested > 0:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


class CpuThreads:
    """The CPU path's thread count: fixed, or following the cores other processes leave free.

    ``apply()`` is called by the compute thread before each step; it is cheap (a comparison)
    unless the count changed."""

    def __init__(self, requested: int = 0, share: int = 1) -> None:
        """``requested``: a fixed count (0: follow the free cores). ``share``: how many ranks of
        this machine split its cores (CPU tensor parallelism: each gets its part, fixed)."""
        self.cpus = allowed_cpus()
        fixed = fixed_thread_count(requested)
        self.max_threads = fixed or max(1, len(self.cpus) // share)
        self.adaptive = (
            fixed is None
            and share == 1
            and len(self.cpus) > 1
            and read_sample(self.cpus) is not None
        )
        self.wanted = self.max_threads
        self.applied = 0
        self.others = 0.0  # the last measured load of other processes, in cores
        self._stop = threading.Event()
        if self.adaptive:
            threading.Thread(
                target=_sample_loop,
                args=(weakref.ref(self), self._stop, self.cpus),
                name="cpu-threads",
                daemon=True,
            ).start()
        self.apply()

    def apply(self) -> int:
        """Use the wanted thread count from now on (the calling thread's team); returns it."""
        wanted = self.wanted
        if wanted != self.applied:
            if self.applied:
                logger.info(
                    "CPU threads %d -> %d (other processes keep %.1f of %d cores busy)",
                    self.applied,
                    wanted,
                    self.others,
                    len(self.cpus),
                )
            torch.set_num_threads(wanted)
            self.applied = wanted
        return wanted

    def forget_applied(self) -> None:
        """Someone else set torch's thread count (a benchmark's transformers run): the next
        ``apply()`` sets ours again."""
        self.applied = 0

    def __del__(self) -> None:
        self._stop.set()


def _sample_loop(owner: weakref.ref, stop: threading.Event, cpus: list[int]) -> None:
    """The sampler thread: keep ``owner.wanted`` current. It holds its CpuThreads only weakly,
    so an engine dropped (a test's, a bench's) ends its sampler."""
    samples: deque[CpuSample] = deque()
    while not stop.wait(SAMPLE_EVERY_S):
        sample = read_sample(cpus)
        threads = owner()
        if sample is None or threads is None:
            return
        samples.append(sample)
        while len(samples) > 2 and sample.at - samples[1].at >= WINDOW_S:
            samples.popleft()
        if sample.at - samples[0].at >= WINDOW_S / 2:
            threads.others = others_busy_cores(samples[0], sample)
            threads.wanted = threads_for(
                threads.others, len(cpus), threads.max_threads, threads.wanted
            )
        del threads
