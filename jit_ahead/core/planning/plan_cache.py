"""Saved plans: planning a model within limits is done once, and read back at every later start.

A plan is saved under a key computed from everything the result depends on:
- the model: every module's class, its plain settings and the shapes, strides and dtypes of its
  parameters and buffers, a forward patched onto an instance, the model's configuration;
- the code its modules run: each module class's source file and the functions and classes its module
  resolves at call time (a kernel library patches those: ``apply_liger_kernel_to_*`` swaps
  ``apply_rotary_pos_emb``);
- the limits, the providers (class, version, source) and the distributions they and the model's classes
  come from (version and installed files, as pip's RECORD lists them with their hashes);
- torch, jit_ahead (its sources), the server's GPU as the families see it, and each family's own header
  (Triton: its version and install key, the Python ABI, the target, the cache-invalidating environment).

A start whose key matches reads the plan instead of planning: no probe forward, no planner. What is on
disk is not queued, so a start whose variants were all built starts no helper. On a miss, the saved
plan of the same model that differs least is named in one log line with what changed.

Plans name modules that helpers import, like records: a folder or file another user can write is
refused, entries are decoded by the families' record decoders (plain dotted names only).

With a store (``JIT_AHEAD_STORE``), a whole plan saved here is published there (``plans/<file name>``), and a
start that has no saved plan of its key fetches it from there into its folder before reading it, checked
as any saved plan: the nodes of a deployment plan a model once between them.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from ..priority import Priority
from ..records import describe_difference
from ..building.shared_files import open_regular, unsafe_because
from ..store import Store, StoreDown, StoreError, say_once

log = logging.getLogger("jit_ahead.planning")

KNOB = "JIT_AHEAD_PLAN_DIR"
# 2: the header holds the body's digest, so a file cut at a line end is refused, not half read; 3: what
# captures found besides variants is kept per family by kind ("extras"), written by the family
FORMAT = 3
# A plan lists variants, not weights: far below this. A larger file is not one jit_ahead wrote, and reading
# it whole would cost the server memory and seconds before it is refused anyway.
MAX_PLAN_BYTES = 256 << 20
_PLAIN = (bool, int, float, str, type(None))
# What tells one GPU from another of the same model (which slot it sits in): no kernel library chooses a
# variant by it, and the ranks of a node, or the nodes of a deployment, share one plan.
DEVICE_IDENTITY = frozenset({"pci_bus_id", "pci_device_id", "pci_domain_id", "uuid"})


def plan_folder(raw: str | None = None) -> Path | None:
    """The folder JIT_AHEAD_PLAN_DIR names (default ``~/.cache/jit_ahead/plans``); None when it is ``0``."""
    from ..knobs import cache_folder

    return cache_folder(KNOB, "plans", raw)


# -- the key ------------------------------------------------------------------------------------------------
def _name(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def model_structure(model) -> list:
    """Each module as (path, class, plain settings, parameters, buffers, patched forward)."""
    rows = []
    for path, module in model.named_modules():
        settings = sorted((k, v) for k, v in vars(module).items()
                          if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN))
        tensors = [[kind, name, list(t.shape), list(t.stride()), str(t.dtype)]
                   for kind, table in (("p", module._parameters), ("b", module._buffers))
                   for name, t in table.items() if t is not None]
        forward = vars(module).get("forward")
        rows.append([path, _name(type(module)), settings, tensors,
                     None if forward is None else _name(getattr(forward, "__func__", forward))])
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    if callable(to_json):
        try:
            rows.append(["config", to_json()])
        except Exception:  # noqa: BLE001 - a config that cannot be written is left to the structure
            rows.append(["config", repr(config)])
    return rows


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def file_digest(path: str | None) -> str | None:
    if not path:
        return None
    try:
        st = os.stat(path)
        return _file_digest(path, st.st_size, st.st_mtime_ns)
    except OSError:
        return None


def code_identity(model) -> dict:
    """For each module class's own module: its source file's digest and what its names resolve to."""
    out = {}
    for cls in {type(m) for m in model.modules()}:
        mod = sys.modules.get(cls.__module__)
        if mod is None or cls.__module__ in out:
            continue
        names = {name: _name(value) for name, value in sorted(vars(mod).items())
                 if isinstance(value, (types.FunctionType, type, functools.partial)) and not name.startswith("__")}
        out[cls.__module__] = {"file": file_digest(getattr(mod, "__file__", None)), "names": names}
    return out


@functools.lru_cache(maxsize=64)
def distribution_digest(package: str) -> list:
    """The distributions that install ``package`` beside it: name, version, and a digest of their RECORD
    (pip writes each installed file's hash there), or of the package's files where there is none. Only
    the dist-info folders next to the package are read (importlib's full scan of every distribution
    costs a start hundreds of milliseconds)."""
    out = []
    for info in _dist_infos(package):
        record = (info / "RECORD").read_text(errors="replace") if (info / "RECORD").exists() else ""
        metadata = importlib.metadata.PathDistribution(info).metadata
        out.append([metadata.get("Name", info.name), metadata.get("Version", "?"),
                    hashlib.sha256(record.encode()).hexdigest()[:16]])
    if not out:  # a package on sys.path only (a source checkout): its files, by size and time
        out.append(["(no distribution)", _tree_digest(package)])
    return sorted(out)


def _dist_infos(package: str) -> list[Path]:
    """The ``*.dist-info`` folders beside ``package`` that name it (top_level.txt, else RECORD)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)  # finds it without importing it
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or []) or ([os.path.dirname(spec.origin)] if spec.origin else [])
    found = []
    for root in {Path(location).parent for location in locations}:
        for info in sorted(root.glob("*.dist-info")):
            try:
                top = info / "top_level.txt"
                if top.exists():
                    names = top.read_text().split()
                else:
                    names = {line.split("/", 1)[0] for line in (info / "RECORD").read_text(errors="replace").splitlines()}
            except OSError:
                continue
            if package in names:
                found.append(info)
    return found


def _tree_digest(package: str) -> str | None:
    mod = sys.modules.get(package)
    if mod is None or not getattr(mod, "__file__", None):
        return None
    root = Path(mod.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _own_sources() -> str:
    """jit_ahead's own sources: planning code that changes plans otherwise under the same version."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update((file_digest(str(path)) or "").encode())
    return digest.hexdigest()[:16]


def plan_key(model, limits, providers: list, families: dict, view) -> dict:
    """The parts of a plan's key; ``digest(parts)`` names the plan."""
    import torch

    from .. import __version__

    packages = {p.library.split(".")[0] for p in providers}
    packages |= {type(m).__module__.split(".")[0] for m in model.modules()}
    return {
        "model": hashlib.sha256(json.dumps(model_structure(model), default=str).encode()).hexdigest(),
        "model_class": _name(type(model)),
        "code": hashlib.sha256(json.dumps(code_identity(model), sort_keys=True).encode()).hexdigest()[:16],
        "limits": repr(limits),
        "providers": sorted([_name(type(p)), str(getattr(p, "version", "")),
                             file_digest(getattr(sys.modules.get(type(p).__module__), "__file__", None))]
                            for p in providers),
        "libraries": {package: distribution_digest(package) for package in sorted(packages) if package != "__main__"},
        "torch": torch.__version__,
        "jit_ahead": [__version__, _own_sources()],
        "device": [view.name, list(view.capability), sorted((k, v) for k, v in view.torch_properties.items()
                                                            if k not in DEVICE_IDENTITY), view.backend,
                   {name: view.parts.get(name) for name in sorted(families)}],
        "families": {name: family.plan_header() for name, family in sorted(families.items())},
    }


def digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


# -- the file -----------------------------------------------------------------------------------------------
def _body_digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@dataclass
class SavedPlan:
    """What planning found: per family, each variant's entry with its first priority, and what its captures
    found besides variants (``Family.extra_kinds``); what it cost; the launch errors it logged."""

    requests: dict = field(default_factory=dict)  # family -> [(priority name, request)]
    extras: dict = field(default_factory=dict)  # family -> {kind: [(priority, item)]}, written by the family
    launches: int = 0
    seconds: float = 0.0
    errors: list = field(default_factory=list)
    created: float = 0.0
    # A partial plan (planning was stopped before it ended): the launch groups' progress, by the group's
    # signature (``planning.group_signature``): the [first, last) ranges of its launches that ran.
    progress: dict | None = None


class PlanStore:
    """One folder of saved plans (``plan-<digest>.jsonl``: a header line with the key, then one line
    per family's entries)."""

    def __init__(self, folder: Path, shared: Store | None = None) -> None:
        self.folder = folder
        self.shared = shared  # the deployment's store, where whole plans are published and fetched
        self.usable = self._check_folder()

    def _check_folder(self) -> bool:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            why = unsafe_because(self.folder, os.stat(self.folder))
        except OSError as exc:
            log.error("%s=%s cannot be used (%s); plans are not saved or read", KNOB, self.folder, exc)
            return False
        if why:
            log.error("%s=%s is %s; saved plans name modules helpers import, so none is saved or read",
                      KNOB, self.folder, why)
            return False
        return True

    def path(self, parts: dict, partial: bool = False) -> Path:
        """The whole plan's file, or (``partial``) the one planning saves its progress to as it goes."""
        return self.folder / f"plan-{digest(parts)}{'.partial' if partial else ''}.jsonl"

    def drop_partial(self, parts: dict) -> None:
        """The whole plan is saved: its partial file goes."""
        try:
            self.path(parts, partial=True).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the partial plan %s (%s)", self.path(parts, partial=True), exc)

    def lock_path(self, parts: dict) -> Path:
        return self.folder / f".plan-{digest(parts)}.lock"

    def load(self, parts: dict, families: dict, partial: bool = False) -> SavedPlan | None:
        """The saved plan for this key (``partial``: the progress of a planning that did not end), or None
        (absent, unreadable, unsafe or not matching)."""
        path = self.path(parts, partial)
        if not partial and self.shared is not None and not os.path.lexists(path):
            self._fetch(path)
        try:
            with open_regular(path) as f:
                info = os.fstat(f.fileno())
                why = unsafe_because(path, info)
                if why:
                    log.error("saved plan %s is %s; it names modules helpers import, so it is ignored", path, why)
                    return None
                if info.st_size > MAX_PLAN_BYTES:
                    log.error("saved plan %s is %d bytes, more than any plan (%d); not read, planning again",
                              path, info.st_size, MAX_PLAN_BYTES)
                    return None
                lines = f.read().splitlines()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.error("saved plan %s cannot be read (%s); planning again", path, exc)
            return None
        except ValueError as exc:  # UnicodeDecodeError: bytes that are no plan of ours
            log.error("saved plan %s is not UTF-8 text (%s); planning again", path, exc)
            return None
        try:
            header = json.loads(lines[0])
            if not isinstance(header, dict):
                raise ValueError(f"its first line is JSON but not an object ({type(header).__name__})")
            if header.get("jit_ahead_plan") != FORMAT or header.get("key") != json.loads(json.dumps(parts, default=str)):
                log.warning("saved plan %s does not match this start; planning again", path)
                return None
            if bool(header.get("partial")) != partial:
                raise ValueError("partial" if not partial else "not partial")
            if header.get("body") != _body_digest(lines[1:]):
                raise ValueError("its body does not match the digest in its header: cut short or edited")
            plan = SavedPlan(launches=int(header["launches"]), seconds=float(header["seconds"]),
                             errors=list(header.get("errors", [])), created=float(header.get("created", 0)))
            if partial:
                plan.progress = {str(sig): [[int(a), int(b)] for a, b in ranges]
                                 for sig, ranges in dict(header["progress"]).items()}
            for line in lines[1:]:
                body = json.loads(line)
                name = body["family"]
                family = families[name]
                entries = []
                for priority, entry in body["entries"]:
                    request = family.plan_decode(entry)
                    if request is not None:
                        entries.append((Priority[priority], request))
                plan.requests[name] = entries
                plan.extras[name] = {kind: [(Priority[p], family.extra_decode(kind, e)) for p, e in found]
                                     for kind, found in dict(body.get("extras", {})).items()
                                     if kind in family.extra_kinds}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            log.error("saved plan %s is unusable (%s: %s); planning again", path, type(exc).__name__, exc)
            return None
        return plan

    def save(self, parts: dict, plan: SavedPlan, families: dict) -> Path | None:
        """Write the plan atomically (aside, then renamed into place); None if it cannot be written. A plan
        with ``progress`` is partial: it goes to the partial file, and a whole one is never replaced."""
        partial = plan.progress is not None
        path = self.path(parts, partial)
        header = {"jit_ahead_plan": FORMAT, "key": parts, "launches": plan.launches, "seconds": round(plan.seconds, 3),
                  "errors": plan.errors, "created": time.time()}
        if partial:
            header.update(partial=True, progress=plan.progress)
        lines = []
        try:
            for name, entries in plan.requests.items():
                family = families[name]
                body = {"family": name, "entries": [[p.name, family.plan_encode(r)] for p, r in entries],
                        "extras": {kind: [[p.name, family.extra_encode(kind, item)] for p, item in found]
                                   for kind, found in plan.extras.get(name, {}).items()}}
                lines.append(json.dumps(body, sort_keys=True))
        except (TypeError, ValueError) as exc:  # a request its family cannot write down
            log.warning("the plan cannot be saved (%s: %s); the next start plans again", type(exc).__name__, exc)
            return None
        header["body"] = _body_digest(lines)
        lines.insert(0, json.dumps(header, sort_keys=True, default=str))
        text = ("\n".join(lines) + "\n").encode()
        try:
            _write_atomically(path, text)
        except OSError as exc:
            log.error("cannot save the plan to %s (%s); the next start plans again", path, exc)
            return None
        if not partial:
            self._publish(path, text)
        return path

    # -- the deployment's store -------------------------------------------------------------------------
    def _publish(self, path: Path, text: bytes) -> None:
        if self.shared is None or self.shared.writes_off:
            return
        try:
            self.shared.put(f"plans/{path.name}", text)
        except StoreDown:
            pass  # the store said so itself
        except StoreError as exc:
            self.shared.writes_failed(f"plan {path.name}", exc)

    def _fetch(self, path: Path) -> None:
        """The store's plan of this name, written into this folder (then read and checked as any saved plan)."""
        try:
            text = self.shared.get(f"plans/{path.name}")
        except StoreDown:
            return
        except StoreError as exc:
            say_once("plan-get", "jit_ahead store %s: %s; skipped, this node plans itself (each unusable plan "
                     "is skipped alike)", self.shared.describe(), exc)
            return
        if text is None:
            return
        try:
            _write_atomically(path, text)
        except OSError as exc:
            log.error("cannot write the plan fetched from the jit_ahead store to %s (%s); planning here", path, exc)
            return
        log.info("plan %s fetched from the jit_ahead store %s", path.name, self.shared.describe())

    def closest(self, parts: dict) -> str | None:
        """What differs between this key and the saved plan of the same model class that differs least."""
        best = None
        for path in self.folder.glob("plan-*.jsonl"):
            if path.name.endswith(".partial.jsonl"):
                continue
            try:
                with open_regular(path) as f:
                    key = json.loads(f.readline()).get("key", {})
            except (OSError, ValueError, AttributeError):
                continue
            if not isinstance(key, dict) or key.get("model_class") != parts.get("model_class"):
                continue
            changed = [name for name in parts if json.dumps(key.get(name), sort_keys=True, default=str)
                       != json.dumps(parts[name], sort_keys=True, default=str)]
            if best is None or len(changed) < len(best[0]):
                best = (changed, key)
        if best is None:
            return None
        changed, key = best
        details = []
        for name in changed:
            if name in ("model", "code"):
                details.append(f"{name} changed")
            elif isinstance(parts[name], dict) and isinstance(key.get(name), dict):
                details.append(f"{name}: " + describe_difference(key[name], parts[name]))
            else:
                details.append(f"{name}: {key.get(name)!r} -> {parts[name]!r}")
        return "; ".join(details)


def _write_atomically(path: Path, data: bytes) -> None:
    """Written aside, then renamed into place: a reader sees the old file or the new one, whole."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(aside, path)
    except OSError:
        try:
            aside.unlink()
        except OSError:
            pass
        raise
