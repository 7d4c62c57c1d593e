"""`python -m traces synth`: synthetic routing with knobs for skew, temporal stickiness and cross-layer correlation.

The generative model, per request, token (in time order), MoE layer and top-k slot j:

1. with probability ``stickiness`` the slot re-uses the expert the previous token of the same request chose in
   slot j of this layer (temporal locality);
2. otherwise, with probability ``correlation``, it takes ``map_l(expert of slot j in the previous MoE layer)``,
   a fixed per-layer bijection that sends the layer-(l-1) expert of popularity rank r to the layer-l expert of
   rank r (cross-layer correlation that keeps each layer's popularity);
3. otherwise it draws from the layer's popularity: a Zipf law with exponent ``skew`` over a random per-layer
   ordering of the experts (global, per-layer hot experts).

A slot that repeats an expert already in the token's top-k is re-drawn from the popularity. Prompt tokens are
routed in encoder layers and generated tokens in decoder layers when the model has both; a decoder-only model
routes every token in every layer.

``--fit REAL`` fits a richer model to a real trace instead (``traces.synthetic.fit``; knobs ``layer_popularity``,
``layer_stickiness``, ``request_concentration``, ``prefix_popularity``, ``layer_transition`` and
``transition_power`` of :class:`SynthKnobs`): per-layer empirical popularity in place of the Zipf law, per-layer
stickiness, each request's own popularity, per-position laws for the opening tokens every request shares, and a
cross-layer pull in place of the rank-for-rank map. It prints the fit checked on held-out requests and writes
a trace with REAL's model shape and request lengths; its metadata hold every knob and what it was fitted to.

``--from-fit FITTED`` generates from the fitted knobs a trace written by ``--fit`` holds, for another model shape:
layers stretched (``traces.synthetic.fit.stretch_layers``), experts and top-k reshaped (``traces.synthetic.reshape``:
the popularity's Lorenz curve resampled, lifts mapped by rank fraction, stickiness and request concentration kept), and
the fitted opening positions kept only as far as every request's prompt reaches (requests without prompt rows drop
them). Its metadata name the fitted trace (file, sha256), the mapping and its assumptions; the large tables are
stored as digests (``DIGESTED``), the same command on the same fitted trace rebuilding them.

The same knobs and seed give a byte-identical file (the trace's date is left empty unless ``--date`` is given).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from moebase.errors import InputError, brief
from traces.format import MAX_CONTEXT, MAX_REQUESTS, LayerInfo, ModelInfo, Provenance, Trace, TraceMeta
from traces.importers.ktparquet import MAX_LAYERS
from traces.io import MAX_ARRAY_BYTES

TOOL = "traces synth"
#: The most cells the generator's tables of a shape may hold (popularity: layers x experts; fitted cross-layer lifts:
#: layers x experts x experts, 256 MiB of floats; Kimi-K2's 60 x 384 x 384 is 8.8M), and the most MoE layers (a
#: trace's, MAX_LAYERS of traces/importers/ktparquet.py): checked before anything is stretched, reshaped or drawn.
MAX_TABLE_CELLS = 1 << 25
KNOB_DECIMALS = 6  # knobs are stored (and so used) rounded to this many decimals


@dataclass(frozen=True)
class SynthKnobs:
    """Everything a synthetic trace is a function of (with the seed).

    The knobs after ``correlation`` describe a model fitted to a real trace (``traces.synthetic.fit``); each is
    optional, and a trace made without them is the same as before they existed:

    - ``layer_popularity`` [layers][experts]: each layer's draw weights (replaces the Zipf ``skew``; a layer's
      popularity ranks, which the cross-layer map follows, are the order of these weights).
    - ``layer_stickiness`` [layers]: P(a slot re-uses the previous token's expert), per layer (replaces
      ``stickiness``).
    - ``request_concentration`` [layers]: each request draws its own popularity per layer from a Dirichlet
      distribution with mean ``layer_popularity`` and this total concentration (small: a request keeps to few
      experts; large: every request routes like the layer as a whole).
    - ``prefix_popularity`` [positions][layers][experts]: draw weights of a request's first routed tokens in a
      layer, one set per position (the fixed opening a chat template gives every answer); those tokens are drawn
      from these alone, neither sticky nor correlated.
    - ``layer_transition`` [layers - 1][experts][experts] and ``transition_power``: for layer l >= 1, entry
      [a][b] of table l - 1 is the lift of layer l's expert b on tokens whose layer l - 1 chose a (how many times
      more often b is chosen there than overall). A token's fresh draws in layer l follow its popularity law
      times (the mean lift of its layer l - 1 experts) to the power ``transition_power`` (0: no cross-layer
      pull; larger: the next layer follows the previous one more tightly). ``correlation`` (the rank-for-rank
      map) is not used with these.
    - ``transition_balance`` (True, or None as before it existed): the pull keeps each layer's popularity (the
      pulled laws of a layer's rows are rescaled per expert, by iterative proportional fitting, so that their mix
      is the unpulled one), and a token's experts are drawn without replacement (an expert a token already holds
      is never drawn again for it). Without it a strong pull drifts each layer's popularity towards the experts
      the previous layer lifts, and a token whose law sits on a few experts is completed by popularity rank.
    """

    model: str = "synthetic"
    num_experts: int = 8
    top_k: int = 2
    encoder_layers: int = 0
    decoder_layers: int = 32
    requests: int = 64
    prompt_len: tuple[int, int] = (16, 64)
    decode_len: tuple[int, int] = (64, 256)
    skew: float = 0.5
    stickiness: float = 0.2
    correlation: float = 0.2
    layer_popularity: tuple[tuple[float, ...], ...] | None = None
    layer_stickiness: tuple[float, ...] | None = None
    request_concentration: tuple[float, ...] | None = None
    prefix_popularity: tuple[tuple[tuple[float, ...], ...], ...] | None = None
    layer_transition: tuple[tuple[tuple[float, ...], ...], ...] | np.ndarray | None = None  # ndarray: reshaped
    transition_power: float | None = None
    transition_balance: bool | None = None

    @classmethod
    def from_dict(cls, d: dict) -> SynthKnobs:
        """Knobs from their form in a trace's metadata (``extra.knobs``); lists become tuples."""
        d = dict(d)
        for name in ("prompt_len", "decode_len", "layer_stickiness", "request_concentration"):
            if isinstance(d.get(name), list):
                d[name] = tuple(d[name])
        if _nested_lists(d.get("layer_popularity"), 2):
            d["layer_popularity"] = tuple(tuple(row) for row in d["layer_popularity"])
        for name in ("prefix_popularity", "layer_transition"):
            if _nested_lists(d.get(name), 3):
                d[name] = tuple(tuple(tuple(row) for row in table) for table in d[name])
        return cls(**d)  # anything else as it is: check() names the knob of the wrong type

    def check(self, knob_names: bool = False) -> None:
        """Raise InputError naming the first impossible knob: by its flag (``--top-k``), or with ``knob_names`` by
        its name in a fitted trace's metadata (``knobs.top_k``). Types first (a fitted trace's knobs come from a
        file), then values, then the size of what they can make, all before anything is built."""
        n = {f: f"knobs.{f}" for f in _FLAG_OF} if knob_names else _FLAG_OF
        self._check_types(n)
        e_max = np.iinfo(np.int16).max
        if not 1 <= self.num_experts <= e_max:
            raise InputError(f"{n['num_experts']} must be 1..{e_max}, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise InputError(f"{n['top_k']} must be 1..{self.num_experts} (the expert count), got {self.top_k}")
        layers = self.encoder_layers + self.decoder_layers
        if self.encoder_layers < 0 or self.decoder_layers < 0 or not 1 <= layers <= MAX_LAYERS:
            what = f"{n['encoder_layers']} and {n['decoder_layers']}"
            raise InputError(
                f"{'--layers, or ' + what if not knob_names else what} must be >= 0 with 1..{MAX_LAYERS} layers in "
                f"all, got {self.encoder_layers} encoder and {self.decoder_layers} decoder layers"
            )
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise InputError(f"{n['requests']} must be 1..{MAX_REQUESTS}, got {self.requests}")
        for name, (lo, hi) in ((n["prompt_len"], self.prompt_len), (n["decode_len"], self.decode_len)):
            if lo < 0 or hi < lo or hi > MAX_CONTEXT:
                raise InputError(f"{name} must be MIN,MAX with 0 <= MIN <= MAX <= {MAX_CONTEXT}, got {lo},{hi}")
        self._check_size(n["requests"])
        if self.encoder_layers and self.prompt_len[0] < 1:
            raise InputError(f"{n['prompt_len']} must be >= 1 when the model has encoder layers")
        if self.prompt_len[1] + self.decode_len[1] < 1:
            raise InputError(f"{n['prompt_len']} and {n['decode_len']} leave every request empty")
        if self.skew < 0:
            raise InputError(f"{n['skew']} must be >= 0, got {self.skew}")
        for name, v in ((n["stickiness"], self.stickiness), (n["correlation"], self.correlation)):
            if not 0.0 <= v <= 1.0:
                raise InputError(f"{name} must lie in [0, 1], got {v}")
        self._check_fitted()

    def _check_types(self, n: dict[str, str]) -> None:
        """Each knob of its type: the model a name, counts integers, lengths two integers, the rest finite numbers."""
        if not isinstance(self.model, str):
            raise InputError(f"{n['model']} must be a model name, got {brief(self.model)}")
        for f in ("num_experts", "top_k", "encoder_layers", "decoder_layers", "requests"):
            if not _is_int(getattr(self, f)):
                raise InputError(f"{n[f]} must be an integer, got {brief(getattr(self, f))}")
        for f in ("prompt_len", "decode_len"):
            v = getattr(self, f)
            if not isinstance(v, tuple) or len(v) != 2 or not all(_is_int(x) for x in v):
                raise InputError(f"{n[f]} must be MIN,MAX (two integers), got {brief(v)}")
        for f in ("skew", "stickiness", "correlation", "transition_power"):
            v = getattr(self, f)
            if not (v is None and f == "transition_power") and not _is_finite(v):
                raise InputError(f"{n.get(f, 'knobs.' + f)} must be a finite number, got {brief(v)}")
        if self.transition_balance is not None and not isinstance(self.transition_balance, bool):
            raise InputError(
                f"knobs.transition_balance must be true, false or null, got {brief(self.transition_balance)}"
            )

    def _check_size(self, flag: str = "--requests") -> None:
        """The largest trace these knobs can make must be one a reader accepts (its expert array at most
        ``MAX_ARRAY_BYTES``), and their fitted tables at most MAX_TABLE_CELLS: checked before anything is drawn, so a
        typo costs a line, not the machine's memory."""
        longest = self.prompt_len[1] + self.decode_len[1]
        layers = self.encoder_layers + self.decoder_layers
        worst = self.requests * longest * layers * self.top_k * 2  # int16 expert ids
        if worst > MAX_ARRAY_BYTES:
            raise InputError(
                f"{flag} {self.requests} of up to {longest} tokens x {layers} layers x top-"
                f"{self.top_k} could make a {worst / 2**30:.1f} GiB trace, above the "
                f"{MAX_ARRAY_BYTES >> 30} GiB a trace may hold: fewer requests or shorter ones"
            )
        positions = len(self.prefix_popularity) if isinstance(self.prefix_popularity, (tuple, list)) else 0
        flags = "--experts and --layers" if flag.startswith("--") else "knobs.num_experts and layers"
        check_table_cells(layers, self.num_experts, self.layer_transition is not None, positions, flags)

    def _check_fitted(self) -> None:
        n_layers, e = self.encoder_layers + self.decoder_layers, self.num_experts
        if self.layer_popularity is not None:
            _check_weights(
                _table(self.layer_popularity, "knobs.layer_popularity"), (n_layers, e), "knobs.layer_popularity"
            )
        if self.prefix_popularity is not None:
            w = _table(self.prefix_popularity, "knobs.prefix_popularity")
            if w.size and (w.ndim != 3 or w.shape[1:] != (n_layers, e)):
                raise InputError(
                    f"knobs.prefix_popularity must be [positions][{n_layers} layers][{e} experts], "
                    f"got shape {list(w.shape)}"
                )
            if w.size:
                _check_weights(w.reshape(-1, e), (w.shape[0] * n_layers, e), "knobs.prefix_popularity")
        if self.layer_transition is not None:
            w = _table(self.layer_transition, "knobs.layer_transition")
            if w.shape != (n_layers - 1, e, e):
                raise InputError(
                    f"knobs.layer_transition must be [{n_layers - 1} layers][{e}][{e}], got shape {list(w.shape)}"
                )
            if w.size and (not np.all(np.isfinite(w)) or w.min() < 0):
                raise InputError("knobs.layer_transition must hold finite lifts >= 0")
        if self.transition_power is not None and not (
            np.isfinite(self.transition_power) and 0 <= self.transition_power <= 64
        ):
            raise InputError(f"knobs.transition_power must lie in [0, 64], got {self.transition_power}")
        for name, lo, hi in (("layer_stickiness", 0.0, 1.0), ("request_concentration", 0.0, np.inf)):
            v = getattr(self, name)
            if v is None:
                continue
            a = _table(v, f"knobs.{name}")
            if a.shape != (n_layers,):
                raise InputError(f"knobs.{name} must list one value per layer ({n_layers}), got shape {list(a.shape)}")
            if (
                not np.all(np.isfinite(a))
                or a.min(initial=lo) < lo
                or a.max(initial=lo) > hi
                or (name == "request_concentration" and a.min(initial=1) <= 0)
            ):
                raise InputError(f"knobs.{name} must hold values in {'(0, inf)' if hi == np.inf else '[0, 1]'}")

    def layers(self) -> tuple[LayerInfo, ...]:
        enc = [LayerInfo(i, "encoder") for i in range(self.encoder_layers)]
        dec = [LayerInfo(i, "decoder") for i in range(self.decoder_layers)]
        return tuple(enc + dec)


#: The flag that sets each knob (a fitted trace's knobs are named ``knobs.NAME`` instead).
_FLAG_OF = {
    "model": "--model",
    "num_experts": "--experts",
    "top_k": "--top-k",
    "encoder_layers": "--encoder-layers",
    "decoder_layers": "--decoder-layers",
    "requests": "--requests",
    "prompt_len": "--prompt-len",
    "decode_len": "--decode-len",
    "skew": "--skew",
    "stickiness": "--stickiness",
    "correlation": "--correlation",
}


def _nested_lists(value, depth: int) -> bool:
    """True when ``value`` is a list whose items, ``depth`` - 1 levels down, are all lists."""
    if depth == 1:
        return isinstance(value, list)
    return isinstance(value, list) and all(_nested_lists(x, depth - 1) for x in value)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_finite(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def _table(value, name: str) -> np.ndarray:
    """A fitted table as floats; InputError naming it when it is not a regular nested list of numbers."""
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a regular table of numbers ({brief(str(exc), 100)})") from None
    if a.dtype.kind not in "iuf":
        raise InputError(f"{name} must hold numbers only, got {brief(value)}")
    return a.astype(float, copy=False)


def table_cells(layers: int, experts: int, transition: bool, positions: int) -> int:
    """Cells of the fitted tables of a shape: popularity [layers][experts], lifts [layers - 1][experts][experts]
    when there are any, opening positions [positions][layers][experts]."""
    return layers * experts * (1 + positions) + (max(layers - 1, 0) * experts * experts if transition else 0)


def check_table_cells(
    layers: int, experts: int, transition: bool, positions: int, flags: str = "--experts and --layers"
) -> None:
    """InputError naming ``flags`` when the fitted tables of a shape would hold more than MAX_TABLE_CELLS cells."""
    cells = table_cells(layers, experts, transition, positions)
    if cells > MAX_TABLE_CELLS:
        raise InputError(
            f"{flags}: {layers} layers x {experts} experts: the generator's tables (popularity: layers x experts; "
            f"fitted cross-layer lifts: layers x experts x experts) would hold {cells} values, more than the "
            f"{MAX_TABLE_CELLS} a synthetic trace may use"
        )


FITTED_KNOBS = (
    "layer_popularity",
    "layer_stickiness",
    "request_concentration",
    "prefix_popularity",
    "layer_transition",
    "transition_power",
    "transition_balance",
)


def _check_weights(w: np.ndarray, shape: tuple[int, int], name: str) -> None:
    if w.shape != shape:
        raise InputError(f"{name} must be [{shape[0]}][{shape[1]}], got shape {list(w.shape)}")
    if w.size and (not np.all(np.isfinite(w)) or w.min() < 0 or (w.sum(axis=-1) <= 0).any()):
        raise InputError(f"{name} must hold finite weights >= 0 with a positive sum in every row")


def generate(
    knobs: SynthKnobs,
    seed: int = 0,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
    date: str | None = None,
    extra: dict | None = None,
    dataset: str = "synthetic",
    digest: tuple[str, ...] = (),
) -> Trace:
    """A synthetic trace. ``lengths`` = (prompt lengths, decode lengths) per request overrides the drawn ones.
    Knobs named in ``digest`` are stored in the metadata as their shape and sha256
    (``traces.synthetic.generator.knobs_sha256``)
    instead of their values (tables too large to bundle)."""
    knobs.check()
    rng = np.random.default_rng(seed)
    e, k = knobs.num_experts, knobs.top_k
    layers = knobs.layers()
    n_layers = len(layers)
    if lengths is None:
        prompt = rng.integers(knobs.prompt_len[0], knobs.prompt_len[1] + 1, knobs.requests)
        decode = rng.integers(knobs.decode_len[0], knobs.decode_len[1] + 1, knobs.requests)
        empty = prompt + decode == 0
        decode[empty] = 1
    else:
        prompt, decode = (np.asarray(x, dtype=np.int64) for x in lengths)
    total = prompt + decode
    offsets = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)
    pop = _Popularity(knobs, rng)

    is_encoder = np.array([x.role == "encoder" for x in layers])
    both_roles = bool(is_encoder.any()) and bool((~is_encoder).any())
    n_tok = int(offsets[-1])
    request = np.repeat(np.arange(total.size), total)
    position = np.arange(n_tok) - np.repeat(offsets[:-1], total)
    in_prompt = position < np.repeat(prompt, total)
    first_of_request = position == 0
    if both_roles:  # a request's first generated token starts the decoder layers' sequence
        first_of_request = first_of_request | (position == np.repeat(prompt, total))
    stickiness = knobs.layer_stickiness or (knobs.stickiness,) * n_layers
    experts = np.full((n_tok, n_layers, k), -1, dtype=np.int16)
    for layer in range(n_layers):
        rows = np.flatnonzero(
            (in_prompt if is_encoder[layer] else ~in_prompt) if both_roles else np.ones(n_tok, dtype=bool)
        )
        if rows.size == 0:
            continue
        n = rows.size
        src = experts[rows, layer - 1].astype(np.int64) if layer > 0 else None
        draw = pop.sampler(layer, request[rows], _rank_in_group(request[rows]), src, rng)
        base = draw(np.arange(n * k) // k).reshape(n, k)
        free = ~draw.in_prefix  # rows outside the prefix: stickiness (and the rank-for-rank map) apply
        if layer > 0 and knobs.correlation > 0 and knobs.layer_transition is None:
            assert src is not None  # the previous layer's experts, from layer 1 on
            mapped = pop.rank_to_expert[layer, pop.expert_to_rank[layer - 1, np.maximum(src, 0)]]
            use = (rng.random((n, k)) < knobs.correlation) & (src >= 0) & free[:, None]
            base = np.where(use, mapped, base)
        sticky = (rng.random((n, k)) < stickiness[layer]) & ~first_of_request[rows][:, None] & free[:, None]
        exclusive = bool(knobs.transition_balance) and isinstance(draw, _TableSampler)
        experts[rows, layer] = _sticky_dedupe(base, sticky, draw, pop.rank_to_expert[layer], exclusive)
    meta = TraceMeta(
        model=ModelInfo(knobs.model, e, k, layers),
        provenance=Provenance("synthetic", TOOL, knobs.model, dataset, date),
        seed=int(seed),
        extra={"knobs": _knobs_dict(knobs, digest), **(extra or {})},
    )
    return Trace(experts, offsets, prompt.astype(np.int64), meta)


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal, sorted ``group`` values (0 for the first)."""
    return np.arange(group.size) - np.searchsorted(group, group, side="left")


class _Popularity:
    """Where a slot's fresh expert is drawn from: per layer, a Zipf law over a random ordering of the experts
    (``skew``) or the fitted ``layer_popularity``; with ``request_concentration`` each request's own draw of it;
    with ``prefix_popularity`` a per-position law for a request's first routed tokens."""

    def __init__(self, knobs: SynthKnobs, rng: np.random.Generator):
        e, n_layers = knobs.num_experts, knobs.encoder_layers + knobs.decoder_layers
        self.knobs, self.e = knobs, e
        if knobs.layer_popularity is None:  # rank_to_expert[l, r] is layer l's rank-r expert
            pop = (np.arange(e) + 1.0) ** -knobs.skew
            self.weights = np.tile(pop / pop.sum(), (n_layers, 1))
            self.rank_to_expert = np.stack([rng.permutation(e) for _ in range(n_layers)])
            self.weights = np.take_along_axis(self.weights, np.argsort(self.rank_to_expert, axis=1), axis=1)
        else:
            w = np.asarray(knobs.layer_popularity, dtype=float)
            self.weights = w / w.sum(axis=1, keepdims=True)
            self.rank_to_expert = np.argsort(-self.weights, axis=1, kind="stable")
        self.expert_to_rank = np.argsort(self.rank_to_expert, axis=1)
        self.prefix = None
        if knobs.prefix_popularity is not None and len(knobs.prefix_popularity):
            p = np.asarray(knobs.prefix_popularity, dtype=float)
            self.prefix = p / p.sum(axis=2, keepdims=True)

    def sampler(
        self, layer: int, request: np.ndarray, position: np.ndarray, src: np.ndarray | None, rng
    ) -> _ZipfSampler | _TableSampler:
        """The draw function of one layer's rows (their requests, positions among the layer's rows, and experts in
        the previous layer, or None for the first layer)."""
        knobs = self.knobs
        if (
            knobs.layer_popularity is None
            and knobs.request_concentration is None
            and self.prefix is None
            and knobs.layer_transition is None
        ):  # the original Zipf draw (same random numbers as before)
            return _ZipfSampler(
                self.rank_to_expert[layer], self.weights[layer][self.rank_to_expert[layer]], rng, request.size
            )
        laws = [self.weights[layer][None, :]]
        source = np.zeros(request.size, dtype=np.int64)
        if knobs.request_concentration is not None:
            alpha = knobs.request_concentration[layer] * self.weights[layer]
            n_req = int(request.max()) + 1 if request.size else 0
            own = rng.dirichlet(np.maximum(alpha, 1e-3), size=n_req)
            bad = ~np.isfinite(own).all(axis=1) | (own.sum(axis=1) <= 0)  # all mass underflowed: use the layer's
            own[bad] = self.weights[layer]
            laws = [_balance(own, np.bincount(request, minlength=n_req), self.weights[layer])]
            source = request.astype(np.int64)
        in_prefix = np.zeros(request.size, dtype=bool)
        if self.prefix is not None:
            n_pre = self.prefix.shape[0]
            in_prefix = position < n_pre
            source = np.where(in_prefix, position, source + n_pre)
            laws = [self.prefix[:, layer, :]] + laws
        follow = None
        power = knobs.transition_power or 0
        if knobs.layer_transition is not None and src is not None and power > 0:
            follow = (np.asarray(knobs.layer_transition[layer - 1], dtype=float), src, float(power))
        return _TableSampler(np.vstack(laws), source, in_prefix, rng, follow, bool(knobs.transition_balance))


def _balance(laws: np.ndarray, rows: np.ndarray, target: np.ndarray, sweeps: int = 3) -> np.ndarray:
    """Requests' own laws [requests, experts] rescaled so that their mix, weighted by each request's ``rows``,
    is ``target`` (a few sweeps of iterative proportional fitting): the requests differ from one another, but
    not, by chance, the layer as a whole."""
    w = rows / max(rows.sum(), 1)
    for _ in range(sweeps):
        mix = w @ laws
        laws = laws * np.where(mix > 0, target / np.maximum(mix, 1e-300), 1.0)
        laws /= np.maximum(laws.sum(axis=1, keepdims=True), 1e-300)
    return laws


class _ZipfSampler:
    """The original draw: one law for every row (rank drawn from the Zipf CDF, mapped to the layer's order)."""

    def __init__(self, by_rank: np.ndarray, law_by_rank: np.ndarray, rng, n_rows: int):
        self.by_rank, self.cdf, self.rng = by_rank, np.cumsum(law_by_rank), rng
        self.in_prefix = np.zeros(n_rows, dtype=bool)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        r = np.minimum(np.searchsorted(self.cdf, self.rng.random(rows.size), side="right"), self.cdf.size - 1)
        return self.by_rank[r]


class _TableSampler:
    """Draws for rows that each follow one of several laws (rows of ``laws`` [m, experts], row i's law
    ``laws[source[i]]``), tilted for rows outside the prefix by the cross-layer pull ``follow`` = (table, the
    rows' previous-layer experts [n, k], power) when given; with ``balance``, the tilted laws rescaled per expert
    so that their mix is the untilted one (``transition_balance``)."""

    CHUNK = 1 << 12  # rows at a time (a chunk gathers rows x top-k x experts lifts)
    CACHE_CELLS = 1 << 24  # tilted laws of up to this many (row, expert) cells are computed once and kept
    BALANCE_SWEEPS = 8  # iterative proportional fitting sweeps of the balanced pull

    def __init__(
        self, laws: np.ndarray, source: np.ndarray, in_prefix: np.ndarray, rng, follow=None, balance: bool = False
    ):
        laws = laws / laws.sum(axis=1, keepdims=True)
        self.laws, self.e = laws, laws.shape[1]
        self.flat = self._flat_cdf(laws)
        self.source, self.in_prefix, self.rng, self.follow = source, in_prefix, rng, follow
        self.column: np.ndarray | None = None  # per-expert factors of the balanced pull
        if follow is not None and balance:
            self.column = self._balancing_columns()
        self.row_flat: np.ndarray | None = None  # every row's tilted CDF, when small enough to keep
        self.row_law: np.ndarray | None = None  # and its tilted law (the re-draws without replacement read it)
        if follow is not None and source.size * self.e <= self.CACHE_CELLS:
            chunks = [np.arange(s, min(s + self.CHUNK, source.size)) for s in range(0, source.size, self.CHUNK)]
            tilted = [self._tilted(c) for c in chunks]
            self.row_flat = np.concatenate(
                [self._flat_cdf(t, int(c[0])) for t, c in zip(tilted, chunks)] or [np.zeros(0)]
            )
            self.row_law = np.concatenate(tilted) if tilted else np.zeros((0, self.e))

    @staticmethod
    def _flat_cdf(laws: np.ndarray, first: int = 0) -> np.ndarray:
        """The laws' CDFs laid end to end, law i's shifted by ``first + i`` (for one searchsorted over all)."""
        cdf = np.cumsum(laws / laws.sum(axis=1, keepdims=True), axis=1)
        if cdf.size:
            cdf[:, -1] = 1.0
        return (cdf + (first + np.arange(laws.shape[0]))[:, None]).ravel()

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        u = self.rng.random(rows.size)
        row_flat = self.row_flat  # None whenever follow is
        if self.follow is None or row_flat is not None:
            flat, src = (self.flat, self.source[rows]) if row_flat is None else (row_flat, rows)
            return np.clip(np.searchsorted(flat, u + src, side="right") - src * self.e, 0, self.e - 1)
        uniq, inverse = np.unique(rows, return_inverse=True)  # one tilted law per row, however many draws
        out = np.empty(rows.size, dtype=np.int64)
        for s in range(0, uniq.size, self.CHUNK):
            law = self._tilted(uniq[s : s + self.CHUNK])
            mine = np.flatnonzero((inverse >= s) & (inverse < s + law.shape[0]))
            local = inverse[mine] - s
            out[mine] = np.searchsorted(self._flat_cdf(law), u[mine] + local, side="right") - local * self.e
        return np.clip(out, 0, self.e - 1)

    def _tilted(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), experts]: each row's law times its cross-layer pull (none in the prefix, or when the
        previous layer routed nothing), and the balancing factors where the pull applies."""
        law, factor, pull = self._pull(rows)
        if self.column is not None:
            factor = factor * self.column
        return law * np.where(pull[:, None], factor, 1.0) + 1e-300

    def _pull(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows' untilted laws, their pull factors (the mean lift over the previous layer's experts, to the
        power) and which rows are pulled."""
        table, src, power = self.follow
        law = self.laws[self.source[rows]]
        prev = src[rows]
        valid = prev >= 0
        score = np.where(valid[:, :, None], table[np.maximum(prev, 0)], 0.0).sum(axis=1)
        score /= np.maximum(valid.sum(axis=1), 1)[:, None]  # mean lift over the previous layer's experts
        return law, score**power, valid.any(axis=1) & ~self.in_prefix[rows]

    def _balancing_columns(self) -> np.ndarray:
        """Per-expert factors c such that the pulled rows' laws ``law * pull * c``, each normalized, mix (averaged
        over the rows) to the mix of their untilted laws: iterative proportional fitting, BALANCE_SWEEPS sweeps."""
        chunks = [np.arange(s, min(s + self.CHUNK, self.source.size)) for s in range(0, self.source.size, self.CHUNK)]
        k = self.follow[1].shape[1]
        target = np.zeros(self.e)
        kept = []  # the pulled rows' law * pull of each chunk, when small enough to keep across sweeps
        for c in chunks:
            law, factor, pull = self._pull(c)
            target += _inclusion(law[pull], k).sum(axis=0)
            if self.source.size * self.e <= self.CACHE_CELLS:
                kept.append(law[pull] * factor[pull])
        column = np.ones(self.e)
        for _ in range(self.BALANCE_SWEEPS):
            mix = np.zeros(self.e)
            for i, c in enumerate(chunks):
                if kept:
                    tilted = kept[i]
                else:
                    law, factor, pull = self._pull(c)
                    tilted = law[pull] * factor[pull]
                mix += _inclusion(tilted * column + 1e-300, k).sum(axis=0)
            column *= np.where(mix > 0, target / np.maximum(mix, 1e-300), 1.0)
            column /= column.max() if column.max() > 0 else 1.0
        return column

    def law_of(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), experts]: each row's law as drawn (tilted and balanced where it is pulled), normalized."""
        if self.follow is None:
            law = self.laws[self.source[rows]]
        else:  # a row's tilted law does not depend on the rows computed with it: the kept one is the same
            law = self._tilted(rows) if self.row_law is None else self.row_law[rows]
        return law / law.sum(axis=1, keepdims=True)

    def draw_excluding(self, rows: np.ndarray, held: np.ndarray) -> np.ndarray:
        """One expert for each of ``rows`` from its law with the experts in ``held`` [len(rows), k] (-1: none)
        left out: drawing a token's experts without replacement."""
        law = self.law_of(rows)
        n = rows.size
        mine = held >= 0
        law[np.repeat(np.arange(n), held.shape[1])[mine.ravel()], held[mine]] = 0.0
        total = law.sum(axis=1, keepdims=True)
        law = np.where(total > 0, law, ~_held_mask(held, self.e))  # all its mass held: any expert it does not hold
        cdf = np.cumsum(law / law.sum(axis=1, keepdims=True), axis=1)
        u = self.rng.random(n)
        return np.minimum((cdf < u[:, None]).sum(axis=1), self.e - 1)


def _inclusion(laws: np.ndarray, k: int) -> np.ndarray:
    """[rows, experts]: each expert's share of a row's k distinct experts when they are drawn from the row's law
    (unnormalized ``laws``): the chance it is among k draws, 1 - (1 - p)^k, as a share of the row's k. Unlike the
    law itself it saturates: an expert a row draws for sure is one of its k, however much of the law it holds."""
    p = laws / laws.sum(axis=1, keepdims=True)
    chance = -np.expm1(k * np.log1p(-np.minimum(p, 1.0 - 1e-12)))
    return chance / chance.sum(axis=1, keepdims=True)


def _held_mask(held: np.ndarray, e: int) -> np.ndarray:
    """bool [len(held), e]: which experts each row of ``held`` (-1: none) holds."""
    out = np.zeros((held.shape[0], e), dtype=bool)
    rows, cols = np.nonzero(held >= 0)
    out[rows, held[rows, cols]] = True
    return out


def _forward_fill(base: np.ndarray, sticky: np.ndarray) -> np.ndarray:
    """choice[t] = choice[t-1] where sticky[t], else base[t]; per column, vectorised over t."""
    n = base.shape[0]
    idx = np.where(sticky, 0, np.arange(n)[:, None])
    np.maximum.accumulate(idx, axis=0, out=idx)
    return np.take_along_axis(base, idx, axis=0)


def _sticky_dedupe(
    base: np.ndarray, sticky: np.ndarray, draw, by_rank: np.ndarray, exclusive: bool = False
) -> np.ndarray:
    """Resolve stickiness along time, then re-draw any slot that repeats an expert of its own token (such a
    slot stops being sticky); repeated until no token holds an expert twice. ``draw(rows)`` draws one fresh
    expert for each of the given rows; with ``exclusive``, the re-draw leaves out the experts the token holds
    (``draw.draw_excluding``), else it draws again, and after 8 attempts takes the most popular free expert."""
    k = base.shape[1]
    choice = _forward_fill(base, sticky)
    for attempt in range(1000):
        dup = np.zeros(choice.shape, dtype=bool)
        for col in range(1, k):
            dup[:, col] = (choice[:, col : col + 1] == choice[:, :col]).any(1)
        if not dup.any():
            return choice
        rows, cols = np.nonzero(dup)
        if exclusive:
            held = choice[rows].astype(np.int64)
            held[np.arange(rows.size), cols] = -1
            base[rows, cols] = draw.draw_excluding(rows, held)
        elif attempt < 8:
            base[rows, cols] = draw(rows)
        else:  # rare: the most popular expert that no other slot of the token holds
            for i, j in zip(rows, cols):
                taken = set(choice[i, :j].tolist()) | set(choice[i, j + 1 :].tolist())
                base[i, j] = next(int(x) for x in by_rank if int(x) not in taken)
        sticky[rows, cols] = False
        choice = _forward_fill(base, sticky)
    raise RuntimeError("synth: could not make each token's experts distinct")


def _knobs_dict(knobs: SynthKnobs, digest: tuple[str, ...] = ()) -> dict:
    """The knobs as JSON-ready metadata; fitted-model knobs appear only when set (so traces made without them
    keep their bytes); those named in ``digest`` as {"shape", "sha256"} of their stored (rounded) values."""
    d = {f.name: getattr(knobs, f.name) for f in dataclasses.fields(knobs)}
    d["prompt_len"], d["decode_len"] = list(knobs.prompt_len), list(knobs.decode_len)
    for name in FITTED_KNOBS:
        v = d.pop(name)
        if v is None:
            continue
        if name in digest:
            d[name] = {"shape": list(np.shape(v)), "sha256": knobs_sha256(v)}
        elif isinstance(v, bool):
            d[name] = v
        else:
            d[name] = round(float(v), 6) if np.ndim(v) == 0 else np.round(np.asarray(v, dtype=float), 6).tolist()
    return d


# ------------------------------------------------------------------------------------------------------ fit


def locality(trace: Trace, capacity: int) -> dict[str, float]:
    """A few locality figures of a trace: popularity skew, overlap with the previous token, the step-wise LRU hit
    rate (the simulator's ``lru`` at batch 1) at ``capacity`` slots per layer, and the transition accuracy."""
    from traces.analysis import stats

    lru, _ = stats.step_lru_hit_rates(trace, [capacity])
    trans = stats.transition_accuracy(trace)[0]
    return {
        "popularity_skew": stats.popularity_skew(trace)[0],
        "overlap_prev": stats.overlap_prev(trace)[0],
        "lru_hit_rate": lru[capacity],
        "transition_accuracy": trans if trans is not None else 0.0,
    }


def knobs_like(
    real: Trace, requests: int | None = None, tokens: int | None = None, **overrides
) -> tuple[SynthKnobs, tuple[np.ndarray, np.ndarray]]:
    """Knobs with REAL's model shape, and request lengths that cycle through REAL's requests: ``requests`` of them,
    or as many as it takes to reach ``tokens`` tokens, or REAL's count."""
    m = real.meta.model
    enc = sum(1 for x in m.layers if x.role == "encoder")
    lengths = real.request_lengths
    if requests is None and tokens is not None:
        cycle = np.cumsum(np.tile(lengths, -(-int(tokens) // max(int(lengths.sum()), 1)) + 1))
        requests = int(np.searchsorted(cycle, tokens, side="left")) + 1
    n = requests or real.num_requests
    pick = np.arange(n) % real.num_requests
    prompt = real.prefill_lengths[pick]
    decode = (lengths - real.prefill_lengths)[pick]
    knobs = SynthKnobs(
        model=m.name,
        num_experts=m.num_experts,
        top_k=m.top_k,
        encoder_layers=enc,
        decoder_layers=len(m.layers) - enc,
        requests=n,
        prompt_len=(int(prompt.min()), int(prompt.max())),
        decode_len=(int(decode.min()), int(decode.max())),
        **overrides,
    )
    return knobs, (prompt, decode)


def knobs_sha256(value) -> str:
    """Digest of a knob table as stored: its values rounded to KNOB_DECIMALS, as little-endian float64, C order,
    preceded by its shape (so a table can be named in metadata without being stored)."""
    a = np.round(np.asarray(value, dtype=float), KNOB_DECIMALS).astype("<f8")
    h = hashlib.sha256(repr(list(a.shape)).encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
