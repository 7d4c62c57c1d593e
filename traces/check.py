"""`python -m traces validate FILE...`: load each trace with every check and print a one-line summary."""

from __future__ import annotations

from traces.io import load_trace


def register(sub) -> None:
    p = sub.add_parser("validate", help="check trace files against the format; exit 2 on the first bad one")
    p.add_argument("files", nargs="+", metavar="FILE", help="trace files (.npz) to check, one line each")
    p.set_defaults(func=run)


def describe(trace) -> str:
    """One line: size, model and provenance of a trace."""
    m, p = trace.meta.model, trace.meta.provenance
    roles = {r: sum(1 for x in m.layers if x.role == r) for r in ("encoder", "decoder")}
    layer_txt = " + ".join(f"{n} {r}" for r, n in roles.items() if n)
    return (
        f"{trace.num_tokens} tokens, {trace.num_requests} requests, {layer_txt} MoE layers, "
        f"{m.num_experts} experts top-{m.top_k}, model {m.name}, {p.kind} by {p.tool}"
    )


def run(args) -> int:
    for f in args.files:
        print(f"{f}: ok: {describe(load_trace(f))}")
    return 0
