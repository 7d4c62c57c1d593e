"""`traces import mixtral-jsonl FILE... --out OUT`: one JSON object per (request, layer, token), as in GitHub
Mario928/speculative-moe's ``routing_data_collected/``:
``{"dataset", "problem_id", "layer", "experts": [...], "gating_probs": [...], "token_idx"}``. Records may be missing
for some layers; tokens are aligned across layers by ``token_idx`` and a token missing in any layer is dropped (the
count per request goes to the trace's ``extra.dropped_tokens`` and to the terminal)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_CONTEXT, ModelInfo, Provenance, Trace, TraceMeta, today
from traces.importers.common import (
    FLOAT16_MAX,
    TOOL,
    check_content,
    check_model_fit,
    check_model_name,
    check_num_experts,
    check_out,
    is_float16,
    is_json_int,
    offsets_of,
    read_json_lines,
    show_list,
)
from traces.io import save_trace

#: The highest MoE layer index a Mixtral record may give (layers run 0..the highest seen).
MAX_LAYER_INDEX = 4095


def add_parser(fmt) -> None:
    """The ``mixtral-jsonl`` format's sub-command."""
    m = fmt.add_parser("mixtral-jsonl", help="per-(request, layer, token) JSON lines with token_idx")
    m.add_argument("files", nargs="+", metavar="FILE", help="JSON-lines routing logs, imported together into one trace")
    m.add_argument("--out", "-o", required=True, help="trace file to write (.npz)")
    m.add_argument("--model", default="mixtral-8x7b", help="model name in the trace (default: %(default)s)")
    m.add_argument(
        "--source-model",
        default="neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
        help="the checkpoint that produced the routing (provenance.model)",
    )
    m.add_argument("--num-experts", type=int, default=8, help="experts per layer (default: %(default)s)")
    m.set_defaults(func=_run_mixtral)


def import_mixtral_jsonl(
    files: list[str | Path],
    model: str = "mixtral-8x7b",
    source_model: str = "neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8",
    num_experts: int = 8,
) -> tuple[Trace, dict[str, int]]:
    """Read per-(request, layer, token) JSON lines; return the trace and the dropped-token count per request."""
    check_model_name(model)
    check_num_experts(num_experts)
    rows: dict[tuple[str, object], dict[int, dict[int, tuple[list, list]]]] = defaultdict(lambda: defaultdict(dict))
    order: list[tuple[str, object]] = []
    top_k = None
    datasets: list[str] = []
    duplicates = 0
    for path in files:
        path = Path(path)
        for lineno, rec in read_json_lines(path):
            where = f"{path}:{lineno}"
            for field in ("problem_id", "layer", "experts", "token_idx"):
                if field not in rec:
                    raise InputError(f"{where}: record has no field '{field}'")
            experts, probs = rec["experts"], rec.get("gating_probs")
            if not isinstance(experts, list) or not experts or not all(is_json_int(x) for x in experts):
                raise InputError(f"{where}: field 'experts' must be a non-empty list of integers")
            top_k = top_k or len(experts)
            if len(experts) != top_k:
                raise InputError(f"{where}: field 'experts' has {len(experts)} ids, earlier records have {top_k}")
            if any(not 0 <= x < num_experts for x in experts):
                raise InputError(f"{where}: expert id outside 0..{num_experts - 1} (see --num-experts)")
            if len(set(experts)) != len(experts):
                raise InputError(f"{where}: field 'experts' repeats an expert ({brief(experts)})")
            if probs is not None and (
                not isinstance(probs, list) or len(probs) != top_k or not all(is_float16(x) for x in probs)
            ):
                raise InputError(
                    f"{where}: field 'gating_probs' must be a list of {top_k} finite numbers within +-{FLOAT16_MAX:.0f}"
                )
            layer, tok = rec["layer"], rec["token_idx"]
            if (
                not is_json_int(layer)
                or not 0 <= layer <= MAX_LAYER_INDEX
                or not is_json_int(tok)
                or not 0 <= tok < MAX_CONTEXT
            ):
                raise InputError(
                    f"{where}: fields 'layer' and 'token_idx' must be integers >= 0 (layer at most "
                    f"{MAX_LAYER_INDEX}, token_idx below {MAX_CONTEXT})"
                )
            pid = rec["problem_id"]
            if not (isinstance(pid, str) or is_json_int(pid)):
                raise InputError(f"{where}: field 'problem_id' must be a string or an integer, got {brief(pid)}")
            dataset = rec.get("dataset", path.stem)
            if not isinstance(dataset, str) or not dataset:
                raise InputError(f"{where}: field 'dataset' must be a non-empty string, got {brief(dataset)}")
            key = (dataset, pid)
            if key not in rows:
                order.append(key)
                if dataset not in datasets:
                    datasets.append(dataset)
            if tok in rows[key][layer]:
                duplicates += 1
                continue
            rows[key][layer][tok] = (experts, probs if probs is not None else [0.0] * top_k)
    if not order or top_k is None:
        raise InputError(f"{files[0]}: no routing records found")
    num_layers = 1 + max(max(layers) for layers in rows.values())

    experts_parts, weight_parts, lengths, dropped = [], [], [], {}
    for key in order:
        layers = rows[key]
        all_tokens = set().union(*(set(layers.get(layer, {})) for layer in range(num_layers)))
        kept = sorted(set.intersection(*(set(layers.get(layer, {})) for layer in range(num_layers))))
        req_id = f"{key[0]}/{key[1]}"
        dropped[req_id] = len(all_tokens) - len(kept)
        e = np.empty((len(kept), num_layers, top_k), dtype=np.int16)
        w = np.empty((len(kept), num_layers, top_k), dtype=np.float16)
        for layer in range(num_layers):
            per_tok = layers[layer]
            e[:, layer, :] = [per_tok[t][0] for t in kept]
            w[:, layer, :] = [per_tok[t][1] for t in kept]
        experts_parts.append(e)
        weight_parts.append(w)
        lengths.append(len(kept))
    meta = TraceMeta(
        model=ModelInfo.decoder_only(model, num_experts, top_k, num_layers),
        provenance=Provenance("imported", f"{TOOL} mixtral-jsonl", source_model or model, "+".join(datasets), today()),
        seed=None,
        request_ids=tuple(f"{k[0]}/{k[1]}" for k in order),
        extra={
            "source_files": [Path(f).name for f in files],
            "alignment": "layers aligned by token_idx; tokens missing in any layer dropped",
            "dropped_tokens": dropped,
            "duplicate_records_ignored": duplicates,
            "routing_of": "decode tokens only (no prefill recorded)",
        },
    )
    trace = Trace(
        np.concatenate(experts_parts),
        offsets_of(lengths),
        np.zeros(len(lengths), np.int64),
        meta,
        np.concatenate(weight_parts),
    )
    check_model_fit(trace, str(files[0]))
    check_content(trace, str(files[0]))
    return trace, dropped


def _run_mixtral(args) -> int:
    check_out(args.out, args.files)
    trace, dropped = import_mixtral_jsonl(args.files, args.model, args.source_model, args.num_experts)
    save_trace(trace, args.out)
    total = sum(dropped.values())
    detail = show_list(f"{k}: {v}" for k, v in dropped.items())
    print(
        f"wrote {args.out}: {trace.num_tokens} tokens in {trace.num_requests} requests, "
        f"{trace.num_layers} layers, top-{trace.top_k}; dropped {total} tokens missing in some layer ({detail})"
    )
    return 0
