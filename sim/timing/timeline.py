"""The timeline sink: what a run with ``--timeline`` records, one span per copy, compute and host-CPU work.

A span is a tuple ``(track, name, start_s, duration_s)``; ``track`` is ``"compute"`` (the GPU's compute stream),
``"copy"`` (the host-to-device link), ``"cpu"`` (the host CPU computing experts) or, in a run with arrivals,
``"request N"`` (request N's ``queued``, ``prefill`` and ``decode`` spans: from its arrival to its first iteration,
to the end of its prompt, to its last token). ``sim/results.py`` writes the
spans as a Chrome/Perfetto trace. The engine and the copy engine hold a :class:`Timeline` only when one was asked
for (else None, and they record nothing).
"""

from __future__ import annotations

__all__ = ["Timeline"]


class Timeline:
    """The spans of one run, in the order the engine recorded them (``spans``)."""

    __slots__ = ("spans",)

    def __init__(self):
        self.spans: list[tuple[str, str, float, float]] = []

    def dense(self, layer: int, start: float, duration: float) -> None:
        """A MoE layer's dense work (attention and the rest) on the compute stream."""
        self.spans.append(("compute", f"L{layer} dense", start, duration))

    def expert(self, layer: int, expert: int, source: str, start: float, duration: float) -> None:
        """An expert computed on the GPU: ``source`` is its tier (a cached expert) or ``copied``."""
        self.spans.append(("compute", f"L{layer} E{expert} {source}", start, duration))

    def lm_head(self, start: float, duration: float) -> None:
        """The LM head that closes an iteration."""
        self.spans.append(("compute", "lm head", start, duration))

    def copy(self, job) -> None:
        """A copy over the link (a :class:`sim.core.copy_queue.CopyJob`), from its start to its landing."""
        kind = "prefetch" if job.was_prefetch else "demand"
        self.spans.append(("copy", f"L{job.layer} E{job.expert} {kind}", job.start, job.end - job.start))

    def host(self, layer: int, what: str, start: float, duration: float) -> None:
        """Host-CPU work of a layer: ``what`` is ``activations d2h``, ``E<expert> cpu`` or ``activations h2d``."""
        self.spans.append(("cpu", f"L{layer} {what}", start, duration))

    def request(self, rec) -> None:
        """A served request's life (a :class:`sim.core.serving.RequestRecord`): queued from its arrival to its first
        iteration's start, prefilling until its prompt is done, decoding until its last token."""
        track, start, finish = f"request {rec.request}", rec.start_s, rec.finish_s
        if start is None or finish is None:
            return
        if start > rec.arrival_s:
            self.spans.append((track, "queued", rec.arrival_s, start - rec.arrival_s))
        decode_from = start
        if rec.prompt_done_s is not None:
            self.spans.append((track, "prefill", start, rec.prompt_done_s - start))
            decode_from = rec.prompt_done_s
        if finish > decode_from:
            self.spans.append((track, "decode", decode_from, finish - decode_from))
