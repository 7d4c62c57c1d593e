"""Where the executor's work runs and how it is timed: a CUDA GPU (a copy stream and a compute stream ordered by
CUDA events, pinned host memory) or the CPU standing in for one (copies by a copy thread, compute in the main
thread, ``time.perf_counter``).

The executor and the copier speak to a backend only through these calls:

- ``host_buffer(n)`` / ``device_buffer(n)``: flat uint8 buffers of ``n`` bytes (host ones pinned on a GPU);
- ``copy_in(dst, src, after)``, from the copy thread: copy host -> device, once the compute that last read
  ``dst`` (its ``after`` marker) is done; returns a :class:`Landed` (the copy's start and end timestamps on the
  device) when the copy has landed;
- ``compute_done()``, from the compute thread: a marker of the work issued so far, for ``copy_in``'s ``after``;
- ``wait_landed(landed)``: order the compute stream after a landed copy;
- ``wait_host(marker)``: block the calling thread until the marked work is done;
- ``on_compute()``: a context that puts the calling thread's work on the compute stream;
- ``to_host(t)``: bring a small tensor (a layer's routing) to the host, waiting for the work that produces it;
- ``mark()`` / ``elapsed(a, b)``: a timestamp on the compute stream, and the seconds between two timestamps (of
  either stream: a copy's ``start``/``end`` too);
- ``synchronize()``: wait for all issued work.

For experts computed on the host CPU (``validate.kernels.HostExperts``):

- ``activations(rows, cols, dtype, host)``: a [rows, cols] tensor on the host (pinned on a GPU) or the device;
- ``to_host_async(dst, src)``: copy activations device -> host on the compute stream (after the work issued so
  far); returns the marker ``wait_host`` blocks on until they are on the host (None: already there);
- ``from_host(dst, src)``: copy activations host -> device on the compute stream (the work issued after it waits);
- ``host_intra_op``: the torch intra-op thread count the host pool's workers run at (None: leave it).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from contextlib import nullcontext


class Landed:
    """A landed copy: timestamps (``mark()``-like) of when it started and ended on the device. On a GPU they are
    CUDA events on the copy stream, so ``elapsed(start, end)`` is the copy itself, not the host's wait for it."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        self.start, self.end = start, end


class CpuBackend:
    """The CPU as the device: compute is synchronous, so a copy may reuse a buffer as soon as it is released."""

    name = "cpu"

    def __init__(self, torch, threads: int = 1):
        self.torch = torch
        self.device = "cpu"
        self.threads = threads
        torch.set_num_threads(threads)

    def host_buffer(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8)

    def device_buffer(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8)

    def copy_in(self, dst, src, after=None) -> Landed:
        t0 = time.perf_counter()
        dst.copy_(src)
        return Landed(t0, time.perf_counter())

    def device_copy(self, dst, src):
        dst.copy_(src)

    def compute_done(self):
        return None

    def wait_landed(self, landed) -> None:
        pass

    def wait_host(self, marker) -> None:
        pass

    def on_compute(self):
        """A context in which the calling thread's work runs on the compute stream (the CPU has one)."""
        return nullcontext()

    def to_host(self, t):
        return t.numpy()

    def mark(self):
        return time.perf_counter()

    def elapsed(self, a, b) -> float:
        return b - a

    def synchronize(self) -> None:
        pass

    host_intra_op = None  # the workers run at the device's ``threads`` (torch's setting is per process)

    def activations(self, rows: int, cols: int, dtype, host: bool = True):
        return self.torch.empty((rows, cols), dtype=dtype)

    def to_host_async(self, dst, src):
        dst.copy_(src)
        return None

    def from_host(self, dst, src) -> None:
        dst.copy_(src)

    def describe(self) -> str:
        return (
            f"CPU {platform.processor() or platform.machine()} as the device ({self.threads} compute thread(s) "
            f"+ 1 copy thread), torch {self.torch.__version__}, host {platform.node()}"
        )


class CudaBackend:
    """A CUDA GPU: host buffers pinned, copies on a dedicated stream, compute on the current stream, ordered by
    CUDA events; timestamps are CUDA events on the compute stream."""

    name = "cuda"

    def __init__(self, torch, device: str = "cuda"):
        self.torch = torch
        self.device = device
        if ":" in device:
            torch.cuda.set_device(int(device.split(":", 1)[1]))
        self.compute = torch.cuda.current_stream()
        self.copy_stream = torch.cuda.Stream()
        # the copy thread takes the GIL back after every copy; by default a busy compute thread gives it up only
        # every 5 ms, a delay the size of a copy
        sys.setswitchinterval(2e-4)

    def host_buffer(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)

    def device_buffer(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def copy_in(self, dst, src, after=None) -> Landed:
        torch = self.torch
        with torch.cuda.stream(self.copy_stream):
            if after is not None:
                self.copy_stream.wait_event(after)
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.copy_stream)  # completes when the copy can start: after ``after``
            dst.copy_(src, non_blocking=True)
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.copy_stream)
        end.synchronize()
        return Landed(start, end)

    def device_copy(self, dst, src):
        dst.copy_(src, non_blocking=True)

    def compute_done(self):
        ev = self.torch.cuda.Event(enable_timing=True)  # timed: the copier measures link gaps from it
        ev.record(self.compute)
        return ev

    def wait_landed(self, landed) -> None:
        if landed is not None:
            self.compute.wait_event(landed.end)

    def wait_host(self, marker) -> None:
        if marker is not None:
            marker.synchronize()

    def on_compute(self):
        """A context in which the calling thread's work runs on the compute stream (a new thread's current stream
        is the default stream, which need not be it)."""
        return self.torch.cuda.stream(self.compute)

    def to_host(self, t):
        return t.cpu().numpy()  # a device -> host copy on the compute stream: the host waits for it

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.compute)
        return ev

    def elapsed(self, a, b) -> float:
        a.synchronize()
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    host_intra_op = 1  # each host worker one core: the compute thread only launches kernels

    def activations(self, rows: int, cols: int, dtype, host: bool = True):
        if host:
            return self.torch.empty((rows, cols), dtype=dtype, pin_memory=True)
        return self.torch.empty((rows, cols), dtype=dtype, device=self.device)

    def to_host_async(self, dst, src):
        dst.copy_(src, non_blocking=True)  # on the compute stream, into pinned memory
        return self.compute_done()

    def from_host(self, dst, src) -> None:
        dst.copy_(src, non_blocking=True)

    def describe(self) -> str:
        t = self.torch
        return (
            f"{t.cuda.get_device_name(self.device)}, torch {t.__version__}, CUDA {t.version.cuda}, "
            f"host {platform.node()}"
        )


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_host_threads(backend) -> int:
    """Worker threads of the host-expert pool (``validate.kernels.HostExperts``): the cores left beside the compute
    thread and the copy thread (on the CPU backend each worker runs at the device's ``threads`` intra-op threads, so
    the cores left over those), at least 1."""
    cores = host_cores()
    if backend.name == "cpu":
        per = max(1, int(getattr(backend, "threads", 1)))
        return max(1, (cores - per - 1) // per)
    return max(1, cores - 2)


def make_backend(device: str, threads: int = 1):
    """The backend for ``device`` ("cpu" or "cuda[:N]"); ValueError when CUDA is asked for and absent."""
    import torch

    if device == "cpu":
        return CpuBackend(torch, threads)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("CUDA is not available on this machine (use the CPU mode)")
        return CudaBackend(torch, device)
    raise ValueError(f"device must be cpu or cuda[:N], got {device!r}")
