"""The coverage report: from a stats log (``JIT_AHEAD_STATS``) to a table per kernel, the unplanned
variants with what differs from the nearest planned one, and an HTML page with a timeline of helper
builds, executor compiles and waits. ``jit-ahead report LOG`` and ``scripts/jit_coverage.py LOG``."""
from __future__ import annotations

import html
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("jit_ahead.report")

# Events that end a span of helper start-up work, drawn on the helper's (or the fork server's) lane.
_START_SPANS = {
    "helper_ready": ("starting", "start and handshake"),
    "helper_preloaded": ("preload", "import kernel modules"),
    "forkserver_ready": ("starting", "fork server: start, import the builder"),
    "forkserver_preloaded": ("preload", "fork server: import kernel modules"),
}


@dataclass
class KernelRow:
    planned: int = 0
    built_ahead: int = 0  # compiled by this process's helpers
    found_built: int = 0  # helpers' builds that found the entry built by another process sharing the cache
    build_failed: int = 0
    loaded: int = 0
    waits: int = 0
    waited_s: float = 0.0
    compiles: dict = field(default_factory=lambda: {"startup": [0, 0.0], "serving": [0, 0.0]})
    unused: int = 0
    planners: set = field(default_factory=set)  # the providers (or "model", the model planner) that planned it
    tuned_ahead: int = 0  # tuning keys its autotuner benchmarked in tune-ahead
    tune_left: int = 0  # tuning keys tune-ahead left to the first launch
    tuned: dict = field(default_factory=lambda: {"startup": set(), "serving": set()})  # keys benchmarked by launches


@dataclass
class Coverage:
    kernels: dict[str, KernelRow]
    unplanned: list[dict]  # kernel, label, phase, outcome, differences
    spans: list[dict]  # lane, start, end, kind, label (seconds since the first event)
    serving_at: float | None
    bad_lines: int
    tune_ahead: list[dict] = field(default_factory=list)  # each tune_ahead event's counts and reasons
    waits: list[dict] = field(default_factory=list)  # launches blocked over LONG_WAIT_S: label, seconds, cause...
    ready: dict | None = None  # the ready line's figures
    own_cpu: tuple[float, dict] | None = None  # jit_ahead's own CPU seconds before serving, and by where


class NotAStatsLog(ValueError):
    """The input holds no jit_ahead event: not a stats log (or one written by a process that logged nothing)."""


def read_events(path: Path) -> tuple[list[dict], int]:
    """The log's events in time order; lines that are not JSON events are counted and skipped. Raises
    NotAStatsLog when no line is one (an empty file, text or binary that is not a stats log)."""
    events, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:  # binary input is bad lines, not a crash
        for line in f:
            try:
                event = json.loads(line)
                if not isinstance(event, dict) or "event" not in event or not isinstance(event.get("time"),
                                                                                          (int, float)):
                    raise ValueError("not an event")
                events.append(event)
            except ValueError:
                bad += 1
    if not events:
        what = "it is empty" if not bad else f"none of its {bad} lines is a jit_ahead event"
        raise NotAStatsLog(f"{path} is not a jit_ahead stats log ({what}); write one with JIT_AHEAD_STATS=1")
    if bad:
        log.warning("%s: %d lines are not jit_ahead events and were skipped", path, bad)
    return sorted(events, key=lambda e: e["time"]), bad


def analyse(records: list[dict], bad_lines: int = 0) -> Coverage:
    """The coverage of a stats log's events (``read_events``), read as the typed events of
    ``core/observing/events.py``; objects that are no declared event (another version's) are passed over."""
    from .core.observing import events as ev
    from .triton.variant_diff import nearest

    t0 = records[0]["time"] if records else 0.0
    typed = [item for item in map(ev.parse, records) if item is not None]
    kernel_of: dict[str, str] = {}
    planned_keys: set[str] = set()
    specs: dict[str, list[str]] = defaultdict(list)  # Triton's specialization JSON, for what differs
    rows: dict[str, KernelRow] = defaultdict(KernelRow)
    for _, e in typed:  # full kernel names by key: planned variants, and misses (unplanned ones too)
        if isinstance(e, ev.Variant):
            planned_keys.add(e.key)
            kernel_of[e.key] = e.kernel
            rows[e.kernel].planned += 1
            if e.spec is not None:
                specs[e.kernel].append(e.spec)
        elif isinstance(e, ev.ExecutorMiss) and e.kernel and e.key:
            kernel_of.setdefault(e.key, e.kernel)
    built, loaded = set(), set()
    starts: dict[tuple, float] = {}
    spans, unplanned, serving_at, tuned = [], [], None, []
    waits, ready, own = [], None, None

    def kernel(key: str | None, name: str | None = None) -> str:
        return kernel_of.get(key, name or "?")

    for stamp, e in typed:
        t = stamp.time - t0
        phase = "serving" if stamp.phase == "serving" else "startup"
        if isinstance(e, ev.Phase) and stamp.phase == "serving" and serving_at is None:
            serving_at = t
        elif isinstance(e, ev.Wait):
            waits.append({**e.fields(), "phase": stamp.phase, "at_s": round(t, 3)})
        elif isinstance(e, ev.Ready):
            ready = {**e.fields(), "at_s": round(t, 3)}
        elif isinstance(e, ev.OwnCpu):
            own = _own_cpu(e.fields()) or own
        elif isinstance(e, ev.AutotuneBench) and not e.ahead:
            rows[e.kernel or "?"].tuned[phase].add(e.tuning_key)
        elif isinstance(e, ev.TuneAhead):
            tuned.append(e.fields())
            for full, (done, left) in e.kernels.items():
                row = rows[full]
                row.tuned_ahead += done
                row.tune_left += left
            if e.seconds:
                spans.append({"lane": "executor", "start": t - e.seconds, "end": t, "kind": "tune",
                              "label": f"tune-ahead: {e.tuned_ahead} tuning keys"})
        elif e.name in _START_SPANS and e.seconds:
            kind, label = _START_SPANS[e.name]
            spans.append({"lane": e.helper, "start": t - e.seconds, "end": t, "kind": kind, "label": label})
        elif isinstance(e, ev.BuildStart):
            starts[(e.helper, e.key)] = t
        elif isinstance(e, ev.BuildFinish) and e.helper != "executor":
            row = rows[kernel(e.key)]
            if e.ok and e.found:  # another process sharing the cache had built it: no compile here
                row.found_built += 1
                built.add(e.key)
            elif e.ok:
                row.built_ahead += 1
                built.add(e.key)
            else:
                row.build_failed += 1
            start = starts.pop((e.helper, e.key), t - (e.seconds or 0))
            spans.append({"lane": e.helper, "start": start, "end": t, "kind": "build" if e.ok else "failed",
                          "label": e.label})
        elif isinstance(e, ev.Compile):
            if e.cache_hit:
                if e.key in planned_keys:  # a planned variant loaded (not a reload of a miss)
                    rows[kernel(e.key, e.kernel)].loaded += 1
                loaded.add(e.key)  # used: a helper's build of a miss is no unused build
            else:
                counts = rows[kernel(e.key, e.kernel)].compiles[phase]
                counts[0] += 1
                counts[1] += e.seconds or 0.0
                spans.append({"lane": "executor", "start": t - (e.seconds or 0), "end": t, "kind": "compile",
                              "label": e.kernel})
        elif isinstance(e, ev.ExecutorMiss):
            name = kernel(e.key, e.kernel)
            calls = _misses_are_calls(e.family)
            if calls:  # no compilation listener: the miss itself says what happened to the call
                _count_call(rows[name], e, phase, loaded, planned_keys, spans, t)
            waited = e.waited if e.waited is not None else e.seconds  # logs before ``waited`` put it in seconds
            if e.outcome == "ready" and (waited or 0) > 0:
                row = rows[name]
                row.waits += 1
                row.waited_s += waited
                spans.append({"lane": "executor", "start": t - waited, "end": t, "kind": "wait", "label": e.label})
            if e.planned is False and e.spec is not None:
                _, diff = nearest(e.spec, specs.get(name, []))
                unplanned.append({"kernel": name, "label": e.label, "phase": stamp.phase, "outcome": e.outcome,
                                  "differences": diff if specs.get(name) else ["no variant of this kernel was planned"]})
            elif e.planned is False and calls:
                unplanned.append({"kernel": name, "label": e.label, "phase": stamp.phase, "outcome": e.outcome,
                                  "differences": [e.reason or "not planned"]})
    for key in built - loaded:
        rows[kernel_of.get(key, "?")].unused += 1
    _planned_by(typed, rows)
    return Coverage(dict(sorted(rows.items())), unplanned, spans, serving_at, bad_lines, tuned,
                    sorted(waits, key=lambda w: -w["seconds"]), ready, own)


def _own_cpu(fields: dict) -> tuple[float, dict] | None:
    """The own_cpu event's figures; None for a line that does not hold them (a log edited by hand)."""
    own, by_where = fields.get("own_s"), fields.get("by_where")
    if not (_is_number(own) and isinstance(by_where, dict) and all(map(_is_number, by_where.values()))):
        return None
    return own, by_where


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _planned_by(typed: list, rows: dict[str, KernelRow]) -> None:
    """Each kernel's planners, from the ``planned`` events (they name kernels without their module)."""
    from .core.observing.events import Planned

    short: dict[str, list[str]] = defaultdict(list)
    for name in rows:
        short[name.rsplit(".", 1)[-1]].append(name)
    for _, e in typed:
        if isinstance(e, Planned) and e.provider:
            for kernel in e.kernels or {}:
                for name in short.get(kernel, ()):
                    rows[name].planners.add(e.provider)


def _misses_are_calls(family: str | None) -> bool:
    """The family's misses are its calls (``FamilyInfo.misses_are_calls``: the CuTe DSL's); a family this
    process does not know is read as Triton's are."""
    from .registry import family_info

    info = family_info(family) if family else None
    return bool(info and info.misses_are_calls)


def _count_call(row: KernelRow, e, phase: str, loaded: set, planned_keys: set, spans: list, t: float) -> None:
    """A call of a family whose misses are its calls (the CuTe DSL's ``cute.compile``): a helper's object
    loaded, or a compile in the server (built in place, a failed build's fallback, or a call jit_ahead
    cannot describe)."""
    if e.outcome in ("disk", "ready"):
        if e.key in planned_keys:
            loaded.add(e.key)
            row.loaded += 1
        return
    counts = row.compiles[phase]
    counts[0] += 1
    counts[1] += e.seconds or 0.0
    spans.append({"lane": "executor", "start": t - (e.seconds or 0), "end": t, "kind": "compile", "label": e.label})


HEADER = ("kernel", "planned by", "planned", "built ahead", "failed", "loaded", "waits", "waited s", "compiles warmup",
          "warmup s", "compiles serving", "serving s", "never used", "tuned ahead", "tune left", "tuned warmup",
          "tuned serving")


def _cells(name: str, row: KernelRow) -> list[str]:
    (cw, sw), (cs, ss) = row.compiles["startup"], row.compiles["serving"]
    return [name, ",".join(sorted(row.planners)) or "-", str(row.planned), str(row.built_ahead), str(row.build_failed), str(row.loaded), str(row.waits),
            f"{row.waited_s:.2f}", str(cw), f"{sw:.2f}", str(cs), f"{ss:.2f}", str(row.unused), str(row.tuned_ahead),
            str(row.tune_left), str(len(row.tuned["startup"])), str(len(row.tuned["serving"]))]


def text(coverage: Coverage) -> str:
    from .core.building.pool import LONG_WAIT_S

    table = [list(HEADER)] + [_cells(name, row) for name, row in coverage.kernels.items()]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in table]
    serving = sum(r.compiles["serving"][0] for r in coverage.kernels.values())
    lines.append("")
    found = sum(r.found_built for r in coverage.kernels.values())
    if found:
        lines.append(f"builds that found their variant built by another process sharing the cache (not counted "
                     f"as built ahead): {found}")
    lines.append(f"executor compiles after serving started: {serving}")
    tuned_serving = sum(len(r.tuned["serving"]) for r in coverage.kernels.values())
    lines.append(f"tuning keys benchmarked by a launch after serving started: {tuned_serving}")
    for e in coverage.tune_ahead:
        why = "; ".join(f"{n} {reason}" for reason, n in (e.get("left_why") or {}).items())
        lines.append(f"tune-ahead: {e.get('tuned_ahead', 0)} tuning keys given a choice (benchmarked, or a stored "
                     f"choice read) in {e.get('seconds', 0)} s, "
                     f"{e.get('chosen_already', 0)} chosen already, {e.get('left', 0)} left to their first launch"
                     + (f" ({why})" if why else ""))
    if coverage.ready is not None:
        r = coverage.ready
        lines.append(f"ready at {r['at_s']:.1f}s (rule {r['rule']}): planning "
                     + ("done" if r["planning_done"] else "still running")
                     + f", {r['listed']} variants listed, {r['built']} built, {r['pending']} queued or building")
    if coverage.own_cpu:
        own, by_where = coverage.own_cpu
        lines.append(f"jit_ahead's own CPU in the server's process before serving: {own:.2f} s ("
                     + ", ".join(f"{what} {seconds:.2f}" for what, seconds in by_where.items() if seconds >= 0.005) + ")")
    lines.append(f"launches that waited over {LONG_WAIT_S}s for a build: {len(coverage.waits)}")
    for w in coverage.waits:
        lines.append(f"    {w['seconds']:.2f}s ({w['phase']}, {w['outcome']}) {w['label']}: {w['cause']}")
    for item in coverage.unplanned:
        lines.append(f"unplanned ({item['phase']}, {item['outcome']}): {item['label']}")
        for diff in item["differences"]:
            lines.append(f"    {diff}")
    return "\n".join(lines) + "\n"


COLORS = {"starting": "#b0b0b0", "preload": "#a9cce3", "build": "#4c9a2a", "failed": "#c0392b",
          "compile": "#e67e22", "wait": "#2980b9", "tune": "#8e44ad"}


def timeline_svg(coverage: Coverage, width: int = 1100) -> str:
    lanes = sorted({s["lane"] for s in coverage.spans if s["lane"] != "executor"},
                   key=lambda n: (len(n), n)) + ["executor"]
    origin = min([s["start"] for s in coverage.spans] + [0.0])  # helpers start before their first event
    end = max([s["end"] for s in coverage.spans] + [coverage.serving_at or 0, 1e-3]) - origin
    left, lane_h, top = 110, 18, 20
    scale = (width - left - 10) / end
    height = top + lane_h * len(lanes) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">']
    for i, lane in enumerate(lanes):
        y = top + i * lane_h
        out.append(f'<text x="4" y="{y + 12}">{html.escape(lane)}</text>')
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y + lane_h}" y2="{y + lane_h}" stroke="#eee"/>')
    for span in coverage.spans:
        y = top + lanes.index(span["lane"]) * lane_h + 2
        x = left + (span["start"] - origin) * scale
        w = max(1.0, (span["end"] - span["start"]) * scale)
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 4}" fill="{COLORS[span["kind"]]}">'
                   f'<title>{html.escape(span["kind"])}: {html.escape(span["label"])} '
                   f'({span["end"] - span["start"]:.2f}s)</title></rect>')
    if coverage.serving_at is not None:
        x = left + (coverage.serving_at - origin) * scale
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 8}" y2="{height - 24}" stroke="black" '
                   f'stroke-dasharray="4,3"/><text x="{x + 3:.1f}" y="{top - 10}">serving</text>')
    for tick in range(0, int(end) + 1, max(1, int(end / 10) or 1)):
        x = left + tick * scale
        out.append(f'<text x="{x:.1f}" y="{height - 8}">{tick + origin:.0f}s</text>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(coverage: Coverage, title: str) -> str:
    rows = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(n, r)) + "</tr>"
                     for n, r in coverage.kernels.items())
    unplanned = "\n".join(f"<li><b>{html.escape(u['label'])}</b> ({html.escape(str(u['phase']))}, "
                          f"{html.escape(str(u['outcome']))})<ul>" +
                          "".join(f"<li><code>{html.escape(d)}</code></li>" for d in u["differences"]) + "</ul></li>"
                          for u in coverage.unplanned) or "<li>none</li>"
    legend = " ".join(f'<span style="background:{c};color:white;padding:1px 6px">{k}</span>'
                      for k, c in COLORS.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
            "td:first-child{text-align:left}table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}"
            f"</style></head><body><h1>{html.escape(title)}</h1><h2>Timeline</h2><p>{legend}</p>"
            f"{timeline_svg(coverage)}<h2>Per kernel</h2><table><tr>"
            + "".join(f"<th>{h}</th>" for h in HEADER) + f"</tr>{rows}</table>"
            f"<h2>Unplanned variants</h2><ul>{unplanned}</ul></body></html>\n")


def report(path: str | Path, html_out: str | Path | None = None) -> str:
    """The text report of stats log ``path``; also the HTML page at ``html_out``. Raises NotAStatsLog for
    input that holds no event, OSError (its ``filename`` naming the file) when a file cannot be read or
    written."""
    events, bad = read_events(Path(path))
    coverage = analyse(events, bad)
    if html_out is not None:
        Path(html_out).write_text(html_page(coverage, f"jit_ahead coverage: {Path(path).name}"), encoding="utf-8")
    return text(coverage)
