"""Expert-activation traces: one file format for recorded, imported and synthetic routing, and tools on it."""

from moebase.errors import InputError, TraceError
from traces.format import FORMAT_VERSION, LayerInfo, ModelInfo, Provenance, Trace, TraceMeta
from traces.io import load_trace, save_trace

__all__ = [
    "FORMAT_VERSION",
    "InputError",
    "LayerInfo",
    "ModelInfo",
    "Provenance",
    "Trace",
    "TraceError",
    "TraceMeta",
    "load_trace",
    "save_trace",
]
