"""`python -m traces import FORMAT FILE... --out OUT`: bring routing recorded elsewhere into the trace format.

Formats, one module each in this package (each with its ``add_parser``):

- ``mixtral-jsonl`` (:mod:`traces.importers.mixtral_jsonl`): one JSON object per (request, layer, token), as in
  GitHub Mario928/speculative-moe's ``routing_data_collected/``; tokens missing in some layer are dropped.
- ``vllm`` (:mod:`traces.importers.vllm`): vLLM's routed-experts output, one int array [tokens, layers, top_k] per
  request, as ``.npy`` files, ``.npz`` archives or ``.jsonl`` lines.
- ``expert-arrays`` (:mod:`traces.importers.arrays`): one ``.npz`` with ``expert_ids`` [tokens, layers, top_k], optional
  ``expert_probs`` (kept as weights) and ``request_offsets``, and a ``requests.json`` beside it whose plain
  per-request fields (data set, prompt length, ...) go to ``meta.request_info``; ``--datasets`` and
  ``--exclude-repetitive`` filter requests. Rows are decode tokens (as in gpt-oss-20b routing recorded with forward
  hooks).
- ``ft-log`` (:mod:`traces.importers.ftlog`): the ``permuted_experts_`` logs of the Pre-gated MoE FasterTransformer
  build (GitHub ceciliawinter/Pregated_MoE, ``expert_log/``): one line per MoE layer call with the sorted expert ids of
  its tokens; each run becomes one static batch of ``--batch`` requests, with encoder and decoder MoE layers.
  Each iteration's active set and tokens per expert are exact; which request chose which expert is not.
- ``kt-parquet`` (:mod:`traces.importers.ktparquet`): kTransformers per-token routing logs, Parquet with one row per
  forward token and MoE layer (``layer_id``, ``token_position``, ``expert_ids``, ``expert_weights``, ``context_id``);
  each request's two warm-up passes are dropped, its prefill pass becomes its prompt rows (in token order) and every
  later pass one decode row; ``--outputs`` checks the counts against the server's output JSONs.
"""

from __future__ import annotations

from traces.importers import arrays, ftlog, ktparquet, mixtral_jsonl, vllm
from traces.run_setup import add_hf_config_flag

FORMATS = (mixtral_jsonl, vllm, arrays, ftlog, ktparquet)


def register(sub) -> None:
    p = sub.add_parser("import", help="convert routing recorded by other tools into a trace file")
    fmt = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    for module in FORMATS:
        module.add_parser(fmt)
    for parser in fmt.choices.values():  # every format: --hf-config, a profile and run config beside the trace
        add_hf_config_flag(parser)
