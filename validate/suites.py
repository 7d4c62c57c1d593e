"""The configuration sets the validator measures: several policies x batch sizes x cache sizes on one model and
trace per device kind. Each configuration is an ordinary run config (``sim run`` reads the same mapping), so the
simulator can replay exactly what was measured.

- ``gpu``: Switch-XXL (bf16, 251.7 MB experts) on the bundled switch-xxl trace: every expert copy is a real
  PCIe transfer of a real expert's bytes.
- ``cpu``: Switch-Base in fp32 (18.9 MB experts) on the bundled switch-base trace, the CPU standing in for the
  GPU (a copy thread moves the experts; see ``validate.backends``).

Decode only (``prefill: false``), one static batch per configuration, a few decode steps each; the first
iteration runs once more beforehand as a warm-up.

Both suites end with hybrid configurations: ``fiddler`` and ``ktransformers`` compute experts that are
not on the device on the host CPU, beside their weights in host memory (the executor's host pool,
``validate.kernels.HostExperts``), so that ``validate compare`` reports the simulator's error on them. They are not
in ``--quick``. Where this version's simulator does not register a policy, ``validate cpu|gpu`` skips its
configurations with a message (``validate.measure.runnable``).

Then two quantized configurations (not in ``--quick`` either): the suite's model with its routed experts stored
weight-only int8 (``expert_bits: 8``) and packed int4 (``expert_bits: 4.25``), copied at those bytes and
de-quantized on the device before their GEMMs (``validate.kernels.QuantLayout``). The model keeps its name, so
the suite's one calibration (its expert, dense and ``dequant_<format>`` tables) serves them too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    name: str
    model: object  # a model name or mapping, as in a run config
    trace: str
    decode_tokens: int  # decode steps per configuration
    quick_decode_tokens: int
    lpc_buffers: int
    points: tuple  # (name, policy, predictor, batch, hpc_slots, mpc_slots[, model overrides[, system]])
    quick: tuple  # names of the points a --quick run measures

    def configs(self, quick: bool = False, only: list[str] | None = None) -> list[tuple[str, dict]]:
        """(name, run-config mapping) of each point measured."""
        names = [p[0] for p in self.points]
        if only:
            unknown = [n for n in only if n not in names]
            if unknown:
                raise KeyError(f"--configs: unknown configuration(s) {', '.join(unknown)}; known: {', '.join(names)}")
        out = []
        for name, policy, predictor, batch, hpc, mpc, *over in self.points:
            if (only and name not in only) or (quick and not only and name not in self.quick):
                continue
            model = copy.deepcopy(self.model)
            if over and over[0]:  # the suite's model with some fields changed (quantized experts)
                model = {**(model if isinstance(model, dict) else {"base": model}), **over[0]}
            system = {"system": copy.deepcopy(over[1])} if len(over) > 1 else {}
            out.append(
                (
                    name,
                    {
                        "model": model,
                        "hardware": "h200",
                        "workload": {
                            "trace": self.trace,
                            "batch_size": batch,
                            "batching": "static",
                            "max_decode_tokens": self.quick_decode_tokens if quick else self.decode_tokens,
                            "prefill": False,
                            "requests": batch,
                        },
                        "cache": {
                            "hpc_slots": hpc,
                            "mpc_slots": mpc,
                            "lpc_buffers": self.lpc_buffers,
                            "prefetch_reserve": 1,
                            "layers": "decoder",
                        },
                        "policy": {"name": policy, "params": {}},
                        "predictor": {"name": predictor, "params": {}},
                        "seed": 0,
                        **system,
                    },
                )
            )
        return out


def point_name(policy: str, batch: int, hpc: int, mpc: int) -> str:
    """A configuration's name: policy, batch size and (for a caching policy) cache slots per layer."""
    return f"{policy}-b{batch}" + (f"-c{hpc + mpc}" if hpc + mpc else "")


def _points(scale: int) -> tuple:
    """(name, policy, predictor, batch, hpc, mpc), batch sizes times ``scale``."""
    base = (
        ("on-demand", "none", 4, 0, 0),
        ("on-demand", "none", 16, 0, 0),
        ("pregated", "oracle", 16, 0, 0),
        ("lru", "none", 8, 2, 4),
        ("diffmoe", "oracle", 8, 2, 4),
        ("diffmoe", "oracle", 16, 4, 9),
        ("moe-infinity", "moe-infinity", 8, 2, 4),
        ("diffmoe-arc", "oracle", 16, 4, 9),
    )
    return tuple((point_name(p, b * scale, h, m), p, pr, b * scale, h, m) for p, pr, b, h, m in base)


#: The policies of the hybrid configurations: experts computed on the host CPU.
HYBRID_POLICIES = ("fiddler", "ktransformers")


def _hybrid(scale: int) -> tuple:
    """(name, policy, predictor, batch, hpc, mpc) of the hybrid configurations, batch sizes times ``scale``."""
    base = (("fiddler", "none", 8, 2, 4), ("ktransformers", "none", 16, 4, 9))
    return tuple((point_name(p, b * scale, h, m), p, pr, b * scale, h, m) for p, pr, b, h, m in base)


#: The quantized configurations' expert widths (bits per weight, scales included): int8 weight-only, and packed
#: int4 with one fp16 scale per 64 weights (the bytes of gpt-oss's MXFP4 experts).
QUANTIZED_BITS = {"int8": 8, "int4": 4.25}
#: The software of the quantized configurations: the executor's kernels de-quantize each expert on the device before
#: its matmuls, which the simulator prices with the calibration's measured ``dequant_int8`` / ``dequant_int4`` tables.
QUANTIZED_SYSTEM = {"base": "ideal", "name": "validator-dequant", "dequant": "measured"}


def _quantized(scale: int) -> tuple:
    """(name, policy, predictor, batch, hpc, mpc, model overrides) of the quantized configurations: the suite's
    model with its experts stored int8 and int4 (``expert_bits``), batch sizes times ``scale``."""
    base = (("lru", "none", 8, 2, 4, "int8"), ("diffmoe", "oracle", 16, 4, 9, "int4"))
    return tuple(
        (
            f"{point_name(p, b * scale, h, m)}-{fmt}",
            p,
            pr,
            b * scale,
            h,
            m,
            {"expert_bits": QUANTIZED_BITS[fmt]},
            QUANTIZED_SYSTEM,
        )
        for p, pr, b, h, m, fmt in base
    )


def _quick(points: tuple) -> tuple:
    """Six of the eight: every policy but the second on-demand and diffmoe-arc."""
    return tuple(p[0] for i, p in enumerate(points) if i not in (1, 7))


_CPU, _GPU = _points(1), _points(2)
SUITES = {
    "cpu": Suite(
        "cpu",
        {"base": "switch-base-128", "dtype_bytes": 4},
        "traces/data/switch_base_128.npz",
        decode_tokens=12,
        quick_decode_tokens=4,
        lpc_buffers=8,
        points=_CPU + _hybrid(1) + _quantized(1),
        quick=_quick(_CPU),
    ),
    "gpu": Suite(
        "gpu",
        "switch-xxl-128",
        "traces/data/switch_xxl_128.npz",
        decode_tokens=8,
        quick_decode_tokens=4,
        lpc_buffers=16,
        points=_GPU + _hybrid(2) + _quantized(2),
        quick=_quick(_GPU),
    ),
}
