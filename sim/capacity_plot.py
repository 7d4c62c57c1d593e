"""The plot of ``sim capacity``: against the arrival rate, the SLO attainment (top: the seeds' mean, and the lowest
seed's, which decides) and the p99 TTFT and TPOT (bottom, log scale), each series in its own colour, marker and line
style, the target and the SLO's bounds as reference lines of the same colour, the answer as a vertical line; legends
outside the data; the title names the policy, model, hardware and batch. PNG bytes, for the command to write
atomically."""

from __future__ import annotations

import io
import textwrap

__all__ = ["capacity_png"]

ATTAINMENT = {"color": "#1f77b4", "marker": "o", "linestyle": "-"}
LOWEST = {"color": "#9467bd", "marker": "v", "linestyle": "--", "markersize": 4}
TTFT = {"color": "#d62728", "marker": "s", "linestyle": "-"}
TPOT = {"color": "#2ca02c", "marker": "^", "linestyle": "--"}
ANSWER = {"color": "#555555", "linestyle": ":", "linewidth": 1.2}


def capacity_png(doc: dict) -> bytes:
    """The plot of a capacity document (``sim.capacity.find_capacity``) as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = doc["points"]
    rates = [p["rate_per_s"] for p in pts]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 6.2), sharex=True)
    top.plot(rates, [p["attainment"] for p in pts], label="SLO attainment (mean over seeds)", **ATTAINMENT)
    lowest = [min(p["attainments"]) for p in pts]
    top.plot(rates, lowest, label="lowest seed (must meet the target)", **LOWEST)
    top.axhline(doc["attainment"], color=ATTAINMENT["color"], linestyle="--", linewidth=1, label="target attainment")
    top.set_ylabel("share of requests\nmeeting the SLO")
    top.set_ylim(-0.03, 1.03)
    for name, key, style in (("TTFT", "ttft_p99_s", TTFT), ("TPOT", "tpot_p99_s", TPOT)):
        xs = [r for r, p in zip(rates, pts) if p[key] is not None]
        ys = [p[key] * 1e3 for p in pts if p[key] is not None]
        if xs:
            bottom.plot(xs, ys, label=f"p99 {name}", **style)
        bound = doc["slo"].get(f"{name.lower()}_s")
        if bound is not None:
            bottom.axhline(bound * 1e3, color=style["color"], linestyle=":", linewidth=1, label=f"SLO {name}")
    bottom.set_yscale("log")
    bottom.set_ylabel("ms (log scale)")
    bottom.set_xlabel("arrival rate (requests/s)")
    rate = doc["max_rate_per_s"]
    if doc["bounded"] and rate > 0:
        for ax in (top, bottom):
            ax.axvline(rate, **ANSWER, label=f"capacity {rate:,.3g} req/s" if ax is top else None)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, borderaxespad=0)
    process = "Poisson" if doc.get("cv") is None else f"gamma cv {doc['cv']:g}"
    bounds = " and ".join(
        f"{k.removesuffix('_s').upper()} <= {v * 1e3:,.0f} ms" for k, v in doc["slo"].items() if v is not None
    )
    title = (
        f"Capacity of {doc['policy']} on {doc['model']}, {doc['hardware']}: batch {doc['batch_size']}, "
        f"{doc['requests']:,} requests x {len(doc['seeds'])} seeds, {process} arrivals; SLO {bounds} "
        f"for {doc['attainment']:.0%} of requests"
    )
    fig.suptitle("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
