"""One check for every configuration dataclass: each field holds the type it declares, before the class checks
its ranges. A range check alone lets NaN through (``nan < 1`` is False) and a float where an int is counted, and
such a value surfaced later, far from its cause: a loop that never ended, a raw ``TypeError`` from a slice."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tkg.errors import ConfigurationError


def check_field_types(config: Any) -> None:
    """Raise :class:`ConfigurationError` naming the first field of the dataclass ``config`` whose value is not
    of its declared type: ``int`` an integer (not a bool), ``float`` a finite real number, ``bool`` a bool,
    ``str`` text, ``tuple[str, ...]`` a tuple of text, another class an instance of it; ``X | None`` also None.
    Other annotations (enums, literals, unions of several types) are left to the class's own checks."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        declared = str(f.type).replace(" ", "")
        base = declared.removesuffix("|None")
        if value is None and base != declared:
            continue
        if base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        elif base == "bool":
            ok = isinstance(value, bool)
        elif base == "str":
            ok = isinstance(value, str)
        elif base == "tuple[str,...]":
            ok = isinstance(value, tuple) and all(isinstance(item, str) for item in value)
        elif base.isidentifier() and base[0].isupper():  # a class: another configuration
            ok = any(cls.__name__ == base for cls in type(value).__mro__)
        else:
            continue
        if not ok:
            wanted = {"int": "an integer", "float": "a finite number", "bool": "True or False", "str": "text"}
            raise ConfigurationError(
                f"{type(config).__name__}.{f.name} must be {wanted.get(base, base)}"
                f"{' or None' if base != declared else ''}, not {value!r}"
            )
