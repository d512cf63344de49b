"""What differs between two variants of one kernel, in the words a provider author needs: which
constexpr, which argument's type or specialization (alignment, ``== 1``), which compile option.

Works on Triton's own specialization JSON (the same on 3.6 and 3.9): arguments are named from the
signature, constants and attributes are mapped back to them by their index paths.
"""
from __future__ import annotations

import json


def _arg_name(names: list[str], path) -> str:
    path = list(path) if isinstance(path, (list, tuple)) else [path]
    if not path or not isinstance(path[0], int) or path[0] >= len(names):
        return str(path)
    return names[path[0]] + "".join(f"[{i}]" for i in path[1:])


def fields(specialization_data: str) -> dict[str, object]:
    """A flat view of one variant: ``arg x_ptr`` type, ``constexpr BLOCK`` value, ``spec n``
    attributes (e.g. divisibility 16), ``option num_warps``, and any other top-level entry as is."""
    return _fields_of(json.loads(specialization_data))


def _fields_of(data: dict) -> dict[str, object]:
    signature = data.get("signature", {})
    names = list(signature)
    out: dict[str, object] = {f"arg {name}": kind for name, kind in signature.items() if kind != "constexpr"}
    for path, value in zip(data.get("constant_keys", []), data.get("constant_vals", [])):
        out[f"constexpr {_arg_name(names, path)}"] = value
    for path, value in zip(data.get("attrs_keys", []), data.get("attrs_vals", [])):
        name = _arg_name(names, path)
        if value:
            out[f"spec {name}"] = ", ".join(f"{k}={v}" for k, v in value) if all(
                isinstance(a, (list, tuple)) and len(a) == 2 for a in value) else value
    for key, value in data.get("options", {}).items():
        out[f"option {key}"] = value
    for key, value in data.items():
        if key not in ("signature", "constant_keys", "constant_vals", "attrs_keys", "attrs_vals", "options",
                       "key", "name"):
            out[key] = value
    return out


def differences(variant: str, other: str) -> list[str]:
    """``field: this -> other`` for each field where two variants (specialization JSON) differ."""
    a, b = fields(variant), fields(other)
    missing = "(none)"
    return [f"{k}: {a.get(k, missing)} -> {b.get(k, missing)}" for k in sorted(a.keys() | b.keys())
            if a.get(k, missing) != b.get(k, missing)]


def nearest(variant: str, candidates: list[str]) -> tuple[str | None, list[str]]:
    """The candidate differing from ``variant`` in the fewest fields, and those differences
    (planned -> actual). A candidate that is not a specialization (a damaged record) is passed over;
    ``variant`` itself must be one (ValueError otherwise)."""
    fields(variant)  # raises on its own input, not on a candidate's
    best, best_diff = None, None
    for candidate in candidates:
        try:
            diff = differences(candidate, variant)
        except (ValueError, TypeError, AttributeError):
            continue
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = candidate, diff
    return best, best_diff or []


def is_specialization(specialization_data: object) -> bool:
    """Whether this is Triton's specialization JSON as ``fields`` reads it: an object with a signature,
    its constants and attributes as lists and its options as an object. A structural check, without the
    field view itself: it runs for each of a saved plan's entries at every start."""
    try:
        data = json.loads(specialization_data)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return False
    return (isinstance(data, dict) and isinstance(data.get("signature"), dict)
            and all(isinstance(data.get(key, []), list) for key in _LISTS)
            and isinstance(data.get("options", {}), dict))


_LISTS = ("constant_keys", "constant_vals", "attrs_keys", "attrs_vals")
