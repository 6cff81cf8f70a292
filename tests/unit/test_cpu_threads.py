"""The CPU path computes on the cores other processes leave free (engine/cpu_threads.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from minisgl_engine import cpu_threads
from minisgl_engine.cpu_threads import (
    CpuSample,
    CpuThreads,
    allowed_cpus,
    others_busy_cores,
    read_sample,
    threads_for,
)


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        (0.0, 4),
        (0.39, 4),
        (0.45, 3),
        (1.0, 3),
        (1.39, 3),
        (1.45, 2),
        (3.0, 1),
        (3.9, 1),
        (8.0, 1),
    ],
)
def test_a_core_counts_as_taken_when_others_use_two_fifths_of_it(others, expected) -> None:
    assert threads_for(others, num_cpus=4, max_threads=4) == expected


def test_a_core_given_up_is_taken_back_only_when_others_use_less_of_it() -> None:
    assert (
        threads_for(0.35, num_cpus=2, max_threads=2, current=1) == 1
    )  # between the two thresholds: stay
    assert threads_for(0.35, num_cpus=2, max_threads=2, current=2) == 2
    assert threads_for(0.25, num_cpus=2, max_threads=2, current=1) == 2
    assert threads_for(0.45, num_cpus=2, max_threads=2, current=2) == 1


def test_never_more_than_the_maximum_nor_fewer_than_one() -> None:
    assert threads_for(0.0, num_cpus=8, max_threads=3) == 3
    assert threads_for(100.0, num_cpus=2, max_threads=2) == 1


def test_others_are_the_busy_time_less_our_own() -> None:
    before = CpuSample(at=10.0, busy_s=100.0, own_s=50.0)
    after = CpuSample(at=12.0, busy_s=104.0, own_s=52.0)  # 2 s: 4 busy core-seconds, 2 of them ours
    assert others_busy_cores(before, after) == pytest.approx(1.0)
    assert (
        others_busy_cores(before, CpuSample(at=12.0, busy_s=101.0, own_s=52.0)) == 0.0
    )  # never negative
    assert others_busy_cores(before, before) == 0.0


def test_a_fixed_count_is_kept(monkeypatch) -> None:
    saved = torch.get_num_threads()
    try:
        threads = CpuThreads(requested=1)
        assert not threads.adaptive and threads.max_threads == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert not CpuThreads().adaptive
        assert (
            CpuThreads(share=2).max_threads == 1 and not CpuThreads(share=2).adaptive
        )  # the ranks' split is fixed
    finally:
        torch.set_num_threads(saved)


needs_two_cpus = pytest.mark.skipif(
    len(allowed_cpus()) < 2 or read_sample(allowed_cpus()) is None,
    reason="needs Linux's /proc/stat and 2 CPUs",
)


@needs_two_cpus
def test_the_count_drops_to_one_while_other_processes_keep_every_core_busy(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "SAMPLE_EVERY_S", 0.1)
    monkeypatch.setattr(cpu_threads, "WINDOW_S", 1.0)
    saved = torch.get_num_threads()
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in allowed_cpus()
    ]
    try:
        threads = CpuThreads()
        assert threads.adaptive and threads.max_threads == len(allowed_cpus())
        deadline = time.monotonic() + 15
        while threads.wanted != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert threads.wanted == 1, (
            f"others use {threads.others:.2f} cores of {len(allowed_cpus())}"
        )
        assert threads.apply() == 1 and torch.get_num_threads() == 1
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        torch.set_num_threads(saved)


@needs_two_cpus
def test_the_apps_own_processes_do_not_count_as_others() -> None:
    """A process of this process group (as the app's workers are) adds to our own CPU time, not
    to the others' load; one in a session of its own adds to the others'."""
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\nprint('busy', flush=True)\ntime.sleep(60)"
    for own_group, counted_as_ours in ((True, True), (False, False)):
        before = read_sample(allowed_cpus())
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            start_new_session=not own_group,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "busy"
            after = read_sample(allowed_cpus())  # while it lives: an ended process leaves /proc
        finally:
            proc.kill()
            proc.wait()
        ours = after.own_s - before.own_s
        assert (ours >= 0.8) == counted_as_ours, (own_group, ours)
        if not counted_as_ours:
            assert others_busy_cores(before, after) * (after.at - before.at) >= 0.8


@needs_two_cpus
def test_the_sampler_ends_with_its_engine(monkeypatch) -> None:
    import gc
    import threading

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "SAMPLE_EVERY_S", 0.05)
    saved = torch.get_num_threads()
    try:
        before = set(threading.enumerate())
        threads = CpuThreads()
        [sampler] = [
            t for t in threading.enumerate() if t not in before and t.name == "cpu-threads"
        ]
        del threads
        gc.collect()
        sampler.join(timeout=5)
        assert not sampler.is_alive()
    finally:
        torch.set_num_threads(saved)
