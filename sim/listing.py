"""`python -m sim policies [--json]`: the registered cache policies and predictors, read from the registries.

One row per policy (name, origin, the predictor ``sim compare --policies all --own-predictors`` gives it, and
the first sentence of its class docstring, else of its module's, whole: a long one wraps onto indented lines), in the
order ``--policies all`` runs them, then one row per predictor (name, first sentence). Nothing here names a policy:
a newly registered one is listed as it is.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap

#: Width of a description's lines on the terminal: a longer one wraps onto the next lines, whole (as in ``--json``).
DESCRIPTION_CHARS = 80
#: Shown for a policy without a ``default_predictor``: it runs with the predictor its config names.
CONFIG_PREDICTOR = "(config's)"
#: The pointer every help that takes a policy or predictor name prints.
SEE_POLICIES = (
    "See python -m sim policies for every registered policy and predictor (name, origin, default "
    "predictor, what it does)."
)

_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z(`\"]|$)")
_NAME_PREFIX = re.compile(r"^`(?P<name>[^`]+)`\s*(?:\((?P<note>[^()]*(?:\([^()]*\)[^()]*)*)\))?\s*:\s*")


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line (RST ````x```` shown as ```x```); ""
    for no docstring."""
    if not doc or not doc.strip():
        return ""
    para = " ".join(re.split(r"\n\s*\n", doc.strip())[0].split()).replace("``", "`")
    end = _SENTENCE_END.search(para)
    return para[: end.end()] if end else para


def describe(cls) -> str:
    """A part's one-line description: the first sentence of its own class docstring (not an inherited one), else
    of its module's docstring, whose leading ```name`:`` or ```name` (note):`` is dropped (the note moves to the
    end)."""
    own = first_sentence(cls.__dict__.get("__doc__"))
    return _capital(own or _module_sentence(cls))


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _module_sentence(cls) -> str:
    """The first sentence of the docstring of ``cls``'s module, without its leading name."""
    text = first_sentence(getattr(sys.modules.get(cls.__module__), "__doc__", None))
    m = _NAME_PREFIX.match(text)
    if not m:
        return text
    rest = text[m.end() :]
    if m.group("note"):
        rest = f"{rest.rstrip('.')} ({m.group('note')})."
    return rest


def policy_rows() -> list[dict]:
    """Every registered policy, in the order ``sim compare --policies all`` runs them: name, origin, default
    predictor (None: the config's), supports_shared, description."""
    from sim.compare import all_entries, origin_of
    from sim.policies import POLICIES

    return [
        {
            "name": name,
            "origin": origin_of(name),
            "default_predictor": predictor,
            "supports_shared": bool(getattr(POLICIES.get(name), "supports_shared", False)),
            "description": describe(POLICIES.get(name)),
        }
        for name, predictor in all_entries()
    ]


def predictor_rows() -> list[dict]:
    """Every registered predictor, by name: name, description."""
    from sim.predictors import PREDICTORS

    return [{"name": name, "description": describe(PREDICTORS.get(name))} for name in PREDICTORS.names()]


def _wrapped(text: str, indent: int, width: int = DESCRIPTION_CHARS) -> str:
    """``text`` whole, wrapped at word boundaries into lines of at most ``width`` characters, the later ones indented
    by ``indent`` spaces to stand under the first (a description is never cut)."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    return ("\n" + " " * indent).join(lines)


def format_listing(policies: list[dict], predictors: list[dict]) -> str:
    """The terminal table: a header, one line per policy, then one line per predictor."""
    w = max([len("policy")] + [len(p["name"]) for p in policies + predictors]) + 2
    lines = [
        f"policies ({len(policies)}): policy.name in a run config, entries of sim compare --policies",
        f"  {'policy':<{w}}{'origin':<11}{'predictor':<14}description",
    ]
    for p in policies:
        lines.append(
            f"  {p['name']:<{w}}{p['origin'] or '-':<11}{p['default_predictor'] or CONFIG_PREDICTOR:<14}"
            f"{_wrapped(p['description'], 2 + w + 11 + 14)}"
        )
    lines += [
        "",
        f"predictors ({len(predictors)}): predictor.name in a run config, POLICY@PREDICTOR in sim compare",
        f"  {'predictor':<{w}}description",
    ]
    lines += [f"  {p['name']:<{w}}{_wrapped(p['description'], 2 + w)}" for p in predictors]
    lines += [
        "",
        "origin: ceiling (every expert resident), baseline (caches nothing), published, ours, bound "
        "(offline, reads the future)",
        f"predictor: the policy's own, which sim compare --policies all --own-predictors gives it (plain --policies "
        f"all gives every policy the config's); {CONFIG_PREDICTOR}: the config's predictor.name",
    ]
    return "\n".join(lines)


def cmd_policies(args) -> int:
    policies, predictors = policy_rows(), predictor_rows()
    if args.json:
        print(json.dumps({"policies": policies, "predictors": predictors}, indent=1))
    else:
        print(format_listing(policies, predictors))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "policies",
        help="list the registered cache policies and predictors",
        description="List every registered cache policy (name, origin, the predictor "
        "sim compare --policies all --own-predictors gives it, one line on what it does) and every "
        "predictor, as registered in sim/policies/ and sim/predictors/.",
    )
    p.add_argument(
        "--json", action="store_true", help="print {policies: [...], predictors: [...]} as JSON (whole first sentences)"
    )
    p.set_defaults(func=cmd_policies)


__all__ = [
    "SEE_POLICIES",
    "cmd_policies",
    "describe",
    "first_sentence",
    "format_listing",
    "policy_rows",
    "predictor_rows",
    "register",
]
