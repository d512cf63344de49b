"""Shape classes: the few calls that reach every variant a call site can launch within the limits.

A planner that calls a model (or a layer) once per shape the limits allow pays for every token count, batch
size and cache length, while the variants they launch barely change. This module finds, from a few calls,
how each launch's arguments depend on the shape, and picks the calls that reach every class:

- a *space* is the set of shapes one kind of call takes: points (b, n), the batch size and the tokens per
  sequence (a prefill) or the cache length (a decode step), within the limits;
- a *site* is one launch place of the call (the kernel, the Python lines that led to it, its rank among
  launches from there); at each sampled point the trace gives each site's raw values;
- each value is explained over the whole space by one *form*: a constant, an integer polynomial in b, n
  and b*n (shapes, strides, byte offsets), a step function of such a quantity (next power of two, ceiling or
  floor division, clamped: block sizes and counts), or an interval of one (a flag, or whether the site
  launches at all). Ambiguities are settled by asking for more points (bisection of a threshold, a point
  where two explanations differ) and every explanation is checked at random points, a new seed each time;
- from the forms, each site's class at any point is known without calling: Triton's integer class (zero,
  one, divisible by 16, 32- or 64-bit) of a specialized integer, the alignment of a tensor's offset, the
  exact value of a constexpr or a tuning-key argument. Classes change only near the forms' breakpoints
  and, for polynomials, with n modulo 16, so every class reachable in the space is reached among the
  points within 17 of a breakpoint, of either end, or of 1, for every batch size;
- a greedy cover of (site, class) pairs picks the points to call.

What cannot be explained by these forms (a value that is none of them, a flag that is not an interval, an
explanation a random check contradicts) gives that problem no classes, with the reason: the caller then
plans every shape, as exact as before and as costly. Several problems (a model's calling conventions, a
provider's layers) are searched together, their rounds sharing each batch of calls.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("jit_ahead.providers.shape_classes")

Point = tuple[int, int]
MONOMIALS = ("n", "b", "bn")
WINDOW = 17  # classes of a polynomial in n repeat every 16 values: one window on each side of a breakpoint
BIG = (1 << 31, -(1 << 31), 1 << 32, 1 << 63)  # where Triton's integer types change


# -- spaces --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Space:
    """Points (b, n): ``batch_min`` <= b <= ``batch_max``, 1 <= n <= ``n_cap``, and b * n <= ``tokens``
    when set (n at least 1 for every batch)."""

    name: str
    batch_min: int
    batch_max: int
    n_cap: int
    tokens: int | None = None

    def n_max(self, b: int) -> int:
        return max(1, self.n_cap if self.tokens is None else min(self.n_cap, self.tokens // b))

    def n_max_array(self, b: np.ndarray) -> np.ndarray:
        if self.tokens is None:
            return np.full_like(b, max(1, self.n_cap))
        return np.maximum(1, np.minimum(self.n_cap, self.tokens // b))

    @property
    def empty(self) -> bool:
        return self.batch_max < self.batch_min or self.n_cap < 1

    def contains(self, point: Point) -> bool:
        b, n = point
        return self.batch_min <= b <= self.batch_max and 1 <= n <= self.n_max(b)

    def random_points(self, count: int, rng: random.Random) -> list[Point]:
        """Points drawn across the whole space: a batch size, then a length up to its longest."""
        points = []
        for _ in range(count):
            b = rng.randint(self.batch_min, self.batch_max)
            points.append((b, rng.randint(1, self.n_max(b))))
        return points

    def start_points(self) -> list[Point]:
        """The first points asked for: both ends of each axis, small values of each integer class, both
        sides of 64 (chunked kernels), and a few batch sizes at the longest length they allow."""
        lo, hi = self.batch_min, self.batch_max
        batches = sorted({b for b in (lo, lo + 1, lo + 2, 7, 16, 17, (lo + hi) // 2, hi - 1, hi) if lo <= b <= hi})
        points = set()
        for b in batches:
            top = self.n_max(b)
            lengths = {1, 2, 3, 16, 17, 64, 65, 100, top, top - 1, (top + 1) // 2} if b in (lo, lo + 1) else \
                {1, 17, 65, top}
            points |= {(b, n) for n in lengths if 1 <= n <= top}
        return sorted(points)

    def point_with(self, u: str, value: int) -> Point | None:
        """A point of the space where the monomial ``u`` equals ``value``, if any."""
        if u == "n":
            for b in range(self.batch_min, self.batch_max + 1):
                if 1 <= value <= self.n_max(b):
                    return b, value
                if self.tokens is None:
                    return None
            return None
        if u == "b":
            return (value, 1) if self.batch_min <= value <= self.batch_max else None
        for b in range(self.batch_min, min(self.batch_max, value) + 1):
            if value % b == 0 and 1 <= value // b <= self.n_max(b):
                return b, value // b
        return None


def monomial(u: str, b: np.ndarray, n: np.ndarray) -> np.ndarray:
    return n if u == "n" else b if u == "b" else b * n


# -- forms ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Const:
    value: object

    def predict(self, b, n):
        return np.full(b.shape, 0, dtype=np.int64) if not isinstance(self.value, int) else \
            np.full(b.shape, self.value, dtype=object if abs(self.value) >= 1 << 62 else np.int64)

    def breaks(self, b, space):
        return []


@dataclass(frozen=True)
class Poly:
    """c0 + c1 b + c2 n + c3 b n."""

    coefficients: tuple[int, int, int, int]

    def predict(self, b, n):
        c0, c1, c2, c3 = self.coefficients
        return c0 + c1 * b + c2 * n + c3 * b * n

    def solve_n(self, b: np.ndarray, value: int) -> np.ndarray:
        """n where the polynomial equals ``value`` at each b (as a float; nan where it never does)."""
        c0, c1, c2, c3 = self.coefficients
        slope = (c2 + c3 * b).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(slope != 0, (float(value) - c0 - c1 * b.astype(float)) / slope, np.nan)

    def breaks(self, b, space):
        return [self.solve_n(b, v) for v in (0, 1, *BIG)]


def _next_pow2(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, dtype=np.int64)
    out = np.ones_like(u)
    positive = u > 1
    out[positive] = np.left_shift(1, np.ceil(np.log2(u[positive].astype(float))).astype(np.int64))
    # float rounding near large powers of two: fix up to the exact next power of two
    out = np.where(out < u, out * 2, out)
    out = np.where((out // 2 >= u) & (out > 1), out // 2, out)
    return out


STEPS: dict[str, Callable] = {
    "pow2": lambda u, k: _next_pow2(u),
    "cdiv": lambda u, k: -(-u // k),
    "div": lambda u, k: u // k,
}
STEP_DIVISORS = tuple(1 << i for i in range(1, 15))
# a division of a quantity with more steps than this within the space is no shape class: as many calls
# as values, or close; such a value is left unexplained (the planner then calls every shape)
MAX_STEPS = 512


@dataclass(frozen=True)
class Step:
    """clamp(step(u), lo, hi) for u a monomial or a polynomial of the site's; step one of ``STEPS``."""

    u: object  # a monomial name or a Poly
    step: str
    k: int
    lo: int | None
    hi: int | None

    def inner(self, b, n):
        return monomial(self.u, b, n) if isinstance(self.u, str) else self.u.predict(b, n)

    def predict(self, b, n):
        value = STEPS[self.step](self.inner(b, n), self.k)
        if self.lo is not None:
            value = np.maximum(value, self.lo)
        if self.hi is not None:
            value = np.minimum(value, self.hi)
        return value

    def breaks(self, b, space):
        if self.step == "pow2":
            levels = [1 << i for i in range(0, 41)]
        else:  # every step within the space (_fit_step takes a division only where they are few)
            top = _inner_top(self.u, space) + self.k
            levels = list(range(-top, top + 1, self.k))
        return _u_breaks(self.u, b, levels)


@dataclass(frozen=True)
class Interval:
    """lo < u <= hi (either end open when None): a flag, or whether a site launches."""

    u: str
    lo: int | None
    hi: int | None

    def predict(self, b, n):
        u = monomial(self.u, b, n)
        inside = np.ones(u.shape, dtype=bool)
        if self.lo is not None:
            inside &= u > self.lo
        if self.hi is not None:
            inside &= u <= self.hi
        return inside.astype(np.int64)

    def breaks(self, b, space):
        return _u_breaks(self.u, b, [v for v in (self.lo, self.hi) if v is not None])


@dataclass(frozen=True)
class Select:
    """``inside`` where u <= at, else ``outside`` (an integer that changes form at a threshold: an offset
    that is a view's at one token and a copy's beyond)."""

    u: str
    at: int
    inside: Poly
    outside: Poly

    def predict(self, b, n):
        return np.where(monomial(self.u, b, n) <= self.at, self.inside.predict(b, n), self.outside.predict(b, n))

    def breaks(self, b, space):
        return _u_breaks(self.u, b, [self.at]) + self.inside.breaks(b, space) + self.outside.breaks(b, space)


def _u_breaks(u, b: np.ndarray, levels: Iterable[int]) -> list[np.ndarray]:
    """n at each b where ``u`` reaches each level (nan where u does not depend on n)."""
    found = []
    for level in levels:
        if isinstance(u, Poly):
            found.append(u.solve_n(b, level))
        elif u == "n":
            found.append(np.full(b.shape, float(level)))
        elif u == "bn":
            found.append(level / b.astype(float))
    return found


# -- classes of values ---------------------------------------------------------------------------------------
_ROW_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93],
                    dtype=np.uint64)


def row_ids(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An id per row of an integer matrix (equal rows, equal ids: 0, 1, ...) and the first row of each id.
    Rows are hashed to one integer each (a sort of those, not of rows, which numpy's unique by rows does
    slowly); rows with equal hashes are then compared, and a collision falls back to numpy's exact way."""
    matrix = np.asarray(matrix, dtype=np.int64)
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        return np.zeros(len(matrix), dtype=np.int64), np.zeros(0, dtype=np.int64)
    with np.errstate(over="ignore"):
        mixed = matrix.astype(np.uint64) * _ROW_MIX[np.arange(matrix.shape[1]) % len(_ROW_MIX)]
        hashed = np.zeros(matrix.shape[0], dtype=np.uint64)
        for column in range(matrix.shape[1]):  # rotate between columns: the hash depends on their order
            hashed = ((hashed << np.uint64(7)) | (hashed >> np.uint64(57))) ^ mixed[:, column]
    _, first, ids = np.unique(hashed, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if not np.array_equal(matrix, matrix[first[ids]]):
        _, first, ids = np.unique(matrix, axis=0, return_index=True, return_inverse=True)
        ids = ids.reshape(-1)
    return ids, first


def int_class(v: np.ndarray) -> np.ndarray:
    """Triton's classes of a specialized integer, finer where unsure: zero, one, divisible by 16, and
    which integer type holds it."""
    v = np.asarray(v, dtype=object) if np.asarray(v).dtype == object else np.asarray(v, dtype=np.int64)
    wide = (v >= (1 << 31)) | (v < -(1 << 31))
    huge = (v >= (1 << 63)) if v.dtype == object else np.zeros(v.shape, dtype=bool)
    return ((v == 0).astype(np.int64) | ((v == 1).astype(np.int64) << 1) | ((v % 16 == 0).astype(np.int64) << 2)
            | (np.asarray(wide, dtype=np.int64) << 3) | (np.asarray(huge, dtype=np.int64) << 4))


@dataclass(frozen=True)
class SlotModel:
    """How one value of a site follows the point: its form and how its value is classed ("int": Triton's
    integer class, "ptr": 16-byte alignment, "exact": the value itself)."""

    name: str
    form: object
    classed: str
    kind: tuple = ()  # (kind, what, exact) of the raw values it explains

    def feature(self, b, n) -> np.ndarray:
        value = self.form.predict(b, n)
        if self.classed == "int":
            return int_class(value)
        if self.classed == "ptr":
            return (np.asarray(value) % 16 == 0).astype(np.int64)
        return np.asarray(value).astype(np.int64) if np.asarray(value).dtype != object else \
            np.asarray([hash(x) for x in value], dtype=np.int64)


@dataclass(frozen=True)
class SiteModel:
    site: tuple
    presence: object  # Interval, or Const(1)
    slots: tuple[SlotModel, ...]
    constants: tuple = ()  # (name, Raw) of the values equal at every point seen

    def classes(self, b: np.ndarray, n: np.ndarray) -> np.ndarray:
        """One integer per point: -1 where the site does not launch, else an id of its class."""
        present = self.presence.predict(b, n).astype(bool)
        if not self.slots:
            return np.where(present, 0, -1)
        features = np.stack([s.feature(b, n) for s in self.slots], axis=1)
        ids, _ = row_ids(features)
        return np.where(present, ids, -1)

    def signature(self) -> tuple:
        return (self.presence, self.slots)


# -- fitting -------------------------------------------------------------------------------------------------
class Unexplained(Exception):
    """A value no form explains: plan every shape instead."""


@dataclass
class Observations:
    """Each sampled point's traced launches, by site: site -> point -> {name: Raw}."""

    points: set = field(default_factory=set)
    sites: dict = field(default_factory=dict)

    _as_dicts: dict = field(default_factory=dict)  # id of a shared values tuple -> (it, its dict)

    def add(self, point: Point, launches: Iterable) -> None:
        self.points.add(point)
        for launch in launches:
            # launches of different points often pass the very same values (launch_trace shares them)
            known = self._as_dicts.get(id(launch.values))
            if known is None or known[0] is not launch.values:
                known = self._as_dicts[id(launch.values)] = (launch.values, dict(launch.values))
            self.sites.setdefault(launch.site, {})[point] = known[1]

    def observed(self, point: Point) -> dict:
        """site -> values at ``point`` (where it launched)."""
        return {site: at[point] for site, at in self.sites.items() if point in at}


def _design(points: list[Point]) -> np.ndarray:
    return np.array([[1, b, n, b * n] for b, n in points], dtype=float)


def _fit_poly(points: list[Point], values: list[int]) -> Poly | None:
    if values and all(v == values[0] for v in values):
        return Poly((values[0], 0, 0, 0))
    if any(abs(v) >= 1 << 52 for v in values):
        return None
    design = _design(points)
    # Only independent columns: where the points fix b (a space of one batch size), 1 and b, n and b n
    # are the same column, and a least-squares split between them need not round to integers.
    columns: list[int] = []
    for column in (0, 2, 1, 3):  # 1, n, b, b n
        if np.linalg.matrix_rank(design[:, columns + [column]]) > len(columns):
            columns.append(column)
    solution, *_ = np.linalg.lstsq(design[:, columns], np.array(values, dtype=float), rcond=None)
    coefficients = [0, 0, 0, 0]
    for column, value in zip(columns, solution):
        coefficients[column] = int(round(value))
    poly = Poly(tuple(coefficients))
    b, n = _arrays(points)
    return poly if np.array_equal(poly.predict(b, n), np.array(values, dtype=np.int64)) else None


def _fit_select(points: list[Point], values: list[int], space: Space, pool: list[Point]):
    """A Select explaining the values, or the points that would settle its threshold; (None, []) if none."""
    found = []
    for u in MONOMIALS:
        us = [_u(u, p) for p in points]
        levels = sorted(set(us))
        for left, right in zip(levels, levels[1:]):
            inside = [i for i, x in enumerate(us) if x <= left]
            outside = [i for i, x in enumerate(us) if x > left]
            a = _fit_poly([points[i] for i in inside], [values[i] for i in inside])
            b = _fit_poly([points[i] for i in outside], [values[i] for i in outside]) if a else None
            if a is not None and b is not None:
                if right - left > 1:
                    point = _nearest_point(u, (left + right) // 2, space)
                    if point is not None and point not in points:
                        return None, [point]
                found.append(Select(u, left, a, b))
    if not found:
        return None, []
    ask = _telling_apart(found, pool, points)
    return (None, ask) if ask else (found[0], [])


def _inner_top(u, space: Space) -> int:
    """The largest magnitude ``u`` takes in the space (a polynomial's is linear in n at each batch size, so
    it is at n = 1 or at the longest n of some batch size)."""
    if isinstance(u, str):
        return _u_range(u, space)[1]
    ends = [(b, n) for b in range(space.batch_min, space.batch_max + 1) for n in (1, space.n_max(b))]
    return int(np.abs(u.predict(*_arrays(ends))).max())


def _fit_step(points: list[Point], values: list[int], inners: list, space: Space) -> Step | None:
    b, n = _arrays(points)
    v = np.array(values, dtype=np.int64)
    for u in inners:
        inner = monomial(u, b, n) if isinstance(u, str) else u.predict(b, n)
        for step, ks in (("pow2", (1,)), ("cdiv", STEP_DIVISORS), ("div", STEP_DIVISORS)):
            for k in ks:
                if step != "pow2" and _inner_top(u, space) > MAX_STEPS * k:
                    continue
                raw = STEPS[step](inner, k)
                below, above = v > raw, v < raw
                lo = int(v[below].min()) if below.any() else None
                hi = int(v[above].max()) if above.any() else None
                if (lo is not None and (not (v[below] == lo).all() or (raw[below] >= lo).any())) or \
                        (hi is not None and (not (v[above] == hi).all() or (raw[above] <= hi).any())):
                    continue
                form = Step(u, step, k, lo, hi)
                if np.array_equal(form.predict(b, n), v):
                    return form
    return None


@dataclass
class _Bracket:
    """An interval explanation of a flag, with each end known only between two values (Interval's lo is
    in [lo_min, lo_max], hi in [hi_min, hi_max]; None: open on that side, as far as the space goes)."""

    u: str
    lo: tuple[int, int] | None
    hi: tuple[int, int] | None

    @property
    def tight(self) -> bool:
        return all(end is None or end[0] == end[1] for end in (self.lo, self.hi))

    def form(self) -> Interval:
        return Interval(self.u, None if self.lo is None else self.lo[1], None if self.hi is None else self.hi[0])

    def open_ends(self) -> list[int]:
        """u values whose answer would tighten an end."""
        asks = []
        for end in (self.lo, self.hi):
            if end is not None and end[0] < end[1]:
                asks.append((end[0] + end[1] + 1) // 2)
        return asks


def _brackets(inside: list[Point], outside: list[Point], space: Space) -> list[_Bracket]:
    """Every monomial whose values at ``inside`` form an interval none of ``outside`` falls in."""
    found = []
    for u in MONOMIALS:
        uin = [_u(u, p) for p in inside]
        uout = [_u(u, p) for p in outside]
        lo_in, hi_in = min(uin), max(uin)
        if any(lo_in <= x <= hi_in for x in uout):
            continue
        below = [x for x in uout if x < lo_in]
        above = [x for x in uout if x > hi_in]
        u_min, u_max = _u_range(u, space)
        lo = (max(below), lo_in - 1) if below else (None if lo_in <= u_min else (u_min - 1, lo_in - 1))
        hi = (hi_in, min(above) - 1) if above else (None if hi_in >= u_max else (hi_in, u_max))
        if lo is not None and lo[0] == lo[1] and lo[0] < u_min:
            lo = None
        if hi is not None and hi[0] == hi[1] and hi[0] >= u_max:
            hi = None
        found.append(_Bracket(u, lo, hi))
    return found


def _u(u: str, point: Point) -> int:
    b, n = point
    return n if u == "n" else b if u == "b" else b * n


@functools.lru_cache(maxsize=256)
def _u_range(u: str, space: Space) -> tuple[int, int]:
    if u == "n":
        return 1, max(space.n_max(b) for b in (space.batch_min, space.batch_max)) if space.tokens else space.n_cap
    if u == "b":
        return space.batch_min, space.batch_max
    return space.batch_min, max(b * space.n_max(b) for b in range(space.batch_min, space.batch_max + 1))


@dataclass
class Fit:
    models: list[SiteModel]
    asks: list[Point]  # points whose calls would settle something


def fit(observations: Observations, space: Space, pool: list[Point], known: dict | None = None) -> Fit:
    """Explain every site over ``space`` from the observations, or say which points to ask for next.
    ``pool``: points of the space where explanations are compared to find a point that tells them apart.
    ``known``: site -> (model, points it was checked at) from earlier rounds, kept while new points agree.
    Raises Unexplained for a value no form explains."""
    points = sorted(observations.points)
    models, asks = [], []
    known = {} if known is None else known
    for site, at in observations.sites.items():
        if site in known:
            model, checked = known[site]
            new = observations.points - checked
            if all(_site_agrees(model, p, at.get(p)) is None for p in new):
                checked |= new
                models.append(model)
                continue
            del known[site]
        inside = sorted(at)
        outside = [p for p in points if p not in at]
        if outside:
            brackets = _brackets(inside, outside, space)
            if not brackets:
                raise Unexplained(f"{_site_name(site)} launches at shapes no interval of {', '.join(MONOMIALS)} "
                                  f"describes")
            presence, ask = _settle(brackets, space, pool)
            if ask:
                asks.extend(ask)
                continue
        else:
            presence = Const(1)
        slots, constants, ask = _slot_models(site, at, inside, space, pool, presence)
        asks.extend(ask)
        model = SiteModel(site, presence, tuple(slots), tuple(constants))
        models.append(model)
        if not ask:
            known[site] = (model, set(observations.points))
    return Fit(models, sorted(set(asks)))


def _settle(brackets: list[_Bracket], space: Space, pool: list[Point]):
    """The one explanation of a flag, or the points that would narrow its candidates."""
    asks = []
    for bracket in brackets:
        for value in bracket.open_ends():
            point = _nearest_point(bracket.u, value, space)
            if point is not None:
                asks.append(point)
    if asks:
        return None, asks
    forms = [bracket.form() for bracket in brackets]
    ask = _telling_apart(forms, pool)
    return (None, ask) if ask else (forms[0], [])


def _telling_apart(forms: list, pool: list[Point], seen: Iterable[Point] = ()) -> list[Point]:
    """A point of ``pool`` (not ``seen``) where the first form and another one differ: its call decides."""
    if len(forms) < 2 or not pool:
        return []
    b, n = _arrays(pool)
    first = forms[0].predict(b, n)
    seen = set(seen)
    for other in forms[1:]:
        for index in np.nonzero(other.predict(b, n) != first)[0]:
            if pool[int(index)] not in seen:
                return [pool[int(index)]]
    return []


def _arrays(points: list[Point]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([p[0] for p in points], dtype=np.int64), np.array([p[1] for p in points], dtype=np.int64))


def _nearest_point(u: str, value: int, space: Space) -> Point | None:
    for delta in itertools.chain([0], itertools.chain.from_iterable((d, -d) for d in range(1, 64))):
        point = space.point_with(u, value + delta)
        if point is not None:
            return point
    return None


def _slot_models(site, at: dict, inside: list[Point], space: Space, pool: list[Point], presence):
    names = sorted({name for values in at.values() for name in values})
    slots, polys, pending, asks, constants = [], [], [], [], []
    for name in names:
        raws = [at[p].get(name) for p in inside]
        if any(r is None for r in raws):
            raise Unexplained(f"{_site_name(site)}: argument {name} is not passed at every launch")
        if raws.count(raws[0]) == len(raws):  # (list.count compares identity first: raws are shared)
            constants.append((name, raws[0]))
            continue
        kinds = {(r.kind, r.what, r.exact) for r in raws}
        if len(kinds) != 1:
            raise Unexplained(f"{_site_name(site)}: argument {name} changes kind ({len(kinds)} kinds)")
        kind, what, exact = next(iter(kinds))
        values = [r.value for r in raws]
        if kind in ("int", "ptr"):
            poly = _fit_poly(inside, values)
            if poly is not None:
                classed = "ptr" if kind == "ptr" else "exact" if exact else "int"
                slots.append(SlotModel(name, poly, classed, (kind, what, exact)))
                polys.append(poly)
                continue
            pending.append((name, values, "ptr" if kind == "ptr" else "exact" if exact else "int", (kind, what, exact)))
            continue
        if all(isinstance(v, bool) for v in values):
            truthy = [p for p, v in zip(inside, values) if v]
            falsy = [p for p, v in zip(inside, values) if not v]
            brackets = _brackets(truthy, falsy, space)
            if not brackets:
                raise Unexplained(f"{_site_name(site)}: flag {name} follows no interval of the shape")
            form, ask = _settle(brackets, space, pool)
            if ask:
                asks.extend(ask)
                continue
            slots.append(SlotModel(name, form, "exact", (kind, what, exact)))
            continue
        raise Unexplained(f"{_site_name(site)}: argument {name} takes {len(set(map(repr, values)))} values "
                          f"that are neither integers nor flags")
    for name, values, classed, raw_kind in pending:
        form = _fit_step(inside, values, list(MONOMIALS) + polys, space)
        if form is None:
            form, ask = _fit_select(inside, values, space, pool)
            if ask:
                asks.extend(ask)
                continue
        if form is None:
            raise Unexplained(f"{_site_name(site)}: integer {name} follows no polynomial or step of the shape "
                              f"(values {sorted(set(values))[:6]}...)")
        slots.append(SlotModel(name, form, classed, raw_kind))
    asks.extend(_rank_asks(inside, slots, presence, pool))
    return slots, constants, asks


def _rank_asks(inside: list[Point], slots: list[SlotModel], presence, pool: list[Point]) -> list[Point]:
    """A polynomial fitted on points of fewer dimensions than the site's launches span may be wrong off
    them: two pool points where the site launches, off what was seen."""
    if not any(isinstance(s.form, Poly) or isinstance(getattr(s.form, "u", None), Poly) for s in slots):
        return []
    seen = np.linalg.matrix_rank(_design(inside))
    if seen >= 4 or not pool:
        return []
    b, n = _arrays(pool)
    where = np.nonzero(presence.predict(b, n).astype(bool))[0]
    asks = []
    for index in where:
        candidate = pool[int(index)]
        if np.linalg.matrix_rank(_design(inside + asks + [candidate])) > seen + len(asks):
            asks.append(candidate)
            if len(asks) == 2:
                break
    return asks


def _site_name(site: tuple) -> str:
    kernel, stack, occurrence = site
    return f"{kernel.rsplit('.', 1)[-1]} (launch {occurrence} from {stack[0][0].rsplit('/', 1)[-1]}:{stack[0][2]})" \
        if stack else kernel


# -- candidate points and the cover --------------------------------------------------------------------------
def candidates(space: Space, models: list[SiteModel]) -> tuple[np.ndarray, np.ndarray]:
    """Points of the space that reach every class the models give anywhere in it: for every batch size,
    lengths within ``WINDOW`` of 1, of the longest, and of every breakpoint of every form."""
    b = np.arange(space.batch_min, space.batch_max + 1, dtype=np.int64)
    top = space.n_max_array(b)
    centres: list[np.ndarray] = [np.ones(b.shape), top.astype(float)]
    forms = {slot.form for model in models for slot in model.slots} | {m.presence for m in models}
    for form in forms:
        centres.extend(form.breaks(b, space))
    columns_b, columns_n = [], []
    offsets = np.arange(-WINDOW, WINDOW + 1)
    for centre in centres:
        valid = np.isfinite(centre) & (np.abs(centre) < 1 << 53)
        if not valid.any():
            continue
        base = np.where(valid, np.floor(np.where(valid, centre, 0)), 0).astype(np.int64)
        n = base[:, None] + offsets[None, :]
        keep = valid[:, None] & (n >= 1) & (n <= top[:, None])
        columns_b.append(np.broadcast_to(b[:, None], n.shape)[keep])
        columns_n.append(n[keep])
    b, n = np.concatenate(columns_b), np.concatenate(columns_n)
    # one integer per (b, n): n >= 1 and n <= top < span, so the pair is b * span + n
    span = int(top.max()) + 1
    pairs = np.unique(b * span + n)
    return pairs // span, pairs % span


def cover(space: Space, models: list[SiteModel], first: Iterable[Point] = ()) -> list[Point]:
    """Points whose calls reach every (site, class) the models give in the space: ``first`` (points that
    will be called anyway), then greedily the point reaching the most classes not reached yet."""
    if not models:
        return list(first)
    unique = {}
    for model in models:
        unique.setdefault(model.signature(), model)
    models = list(unique.values())
    b, n = candidates(space, models)
    first = [p for p in first if space.contains(p)]
    if first:
        b = np.concatenate([np.array([p[0] for p in first], dtype=np.int64), b])
        n = np.concatenate([np.array([p[1] for p in first], dtype=np.int64), n])
    matrix = np.stack([m.classes(b, n) for m in models], axis=1)
    _, representative = row_ids(matrix)
    rows = matrix[representative]
    covered = [set() for _ in models]
    chosen: list[Point] = []

    def take(row: np.ndarray) -> int:
        gained = 0
        for column, cls in enumerate(row):
            if cls >= 0 and cls not in covered[column]:
                covered[column].add(int(cls))
                gained += 1
        return gained

    for index in range(len(first)):
        take(matrix[index])
        chosen.append(first[index])

    def gain(row: np.ndarray) -> int:
        return sum(1 for column, cls in enumerate(row) if cls >= 0 and int(cls) not in covered[column])

    heap = [(-gain(row), i) for i, row in enumerate(rows)]
    heapq.heapify(heap)
    while heap:
        negative, i = heapq.heappop(heap)
        current = gain(rows[i])
        if current == 0:
            continue
        if heap and current < -heap[0][0]:
            heapq.heappush(heap, (-current, i))
            continue
        take(rows[i])
        where = int(representative[i])
        chosen.append((int(b[where]), int(n[where])))
    return list(dict.fromkeys(chosen))


# -- the search ----------------------------------------------------------------------------------------------
@dataclass
class Classified:
    """Each space's site models, the points whose calls reach every class, and what the search cost."""

    models: dict[str, list[SiteModel]]
    points: dict[str, list[Point]]
    calls: int  # calls made to sample and check
    checked: int  # random points whose launches matched the models


def agrees(models: list[SiteModel], point: Point, seen: dict) -> str | None:
    """None when the models predict exactly the sites and classes traced at ``point``; else what differs."""
    known = {m.site: m for m in models}
    for site in seen:
        if site not in known:
            return f"{_site_name(site)} launched, and no sample had seen it"
    for model in models:
        why = _site_agrees(model, point, seen.get(model.site))
        if why is not None:
            return why
    return None


def _site_agrees(model: SiteModel, point: Point, values: dict | None) -> str | None:
    """None when ``model`` predicts what the site did at ``point`` (``values``: None where it did not launch)."""
    b = np.array([point[0]], dtype=np.int64)
    n = np.array([point[1]], dtype=np.int64)
    present = bool(model.presence.predict(b, n)[0])
    if present != (values is not None):
        return f"{_site_name(model.site)} {'did not launch' if present else 'launched'} against its model"
    if not present:
        return None
    for name, raw in model.constants:
        if values.get(name) != raw:
            return f"{_site_name(model.site)}: {name} was {values.get(name)}, constant {raw} before"
    for slot in model.slots:
        raw = values.get(slot.name)
        if raw is None or (slot.kind and (raw.kind, raw.what, raw.exact) != slot.kind):
            return f"{_site_name(model.site)}: {slot.name} is {raw}, of another kind than before"
        predicted = slot.form.predict(b, n)[0]
        actual = raw.value
        if int(predicted) != (int(actual) if not isinstance(actual, bool) else int(actual)):
            return f"{_site_name(model.site)}: {slot.name} was {actual}, its model says {predicted}"
    return None


@dataclass(frozen=True)
class Problem:
    """One search: the spaces of one kind of call and how to sample it. ``sample(point)`` calls at
    ``point`` and returns, per space name, the traced launches that call made in that space (a prefill
    point also gives the decode step on its cache); ``who`` names it in log lines."""

    who: str
    spaces: tuple[Space, ...]
    sample: Callable[[Point], dict[str, list]]


class _Search:
    """One problem's search, a round at a time: the points it asks for, then what their calls traced.
    Rounds of several searches are made together, so that they share each batch of forked calls."""

    def __init__(self, spaces: Iterable[Space], rng: random.Random, checks: int, rounds: int) -> None:
        self.spaces = [s for s in spaces if not s.empty]
        self.rng = rng
        self.checks = checks
        self.rounds_left = rounds
        self.observations = {s.name: Observations() for s in self.spaces}
        self.by_name = {s.name: s for s in self.spaces}
        self.pools = {s.name: s.random_points(400, rng) for s in self.spaces}
        self.known: dict[str, dict] = {s.name: {} for s in self.spaces}
        self.fits: dict[str, Fit] = {}
        self.drawn: dict[str, list[Point]] | None = None  # the random checks asked for, to be judged
        self.calls = 0
        self.checked = 0
        self.result: Classified | None = None
        self.asked = self._new([p for space in self.spaces for p in space.start_points()])

    def _new(self, points: Iterable[Point]) -> list[Point]:
        """The points not yet called in every space that holds them."""
        return [p for p in dict.fromkeys(points)
                if not all(p in self.observations[s.name].points for s in self.spaces if s.contains(p))]

    def take(self, point: Point, found: dict[str, list]) -> None:
        self.calls += 1
        for name, launches in found.items():
            if name in self.observations and self.by_name[name].contains(point):
                self.observations[name].add(point, launches)

    def advance(self) -> list[Point]:
        """Once the asked points are taken: the next points to call; [] when ``result`` is set. Raises
        Unexplained with the reason when a value has no explanation or the checks keep contradicting."""
        while True:
            if self.drawn is not None:
                contradicted = self._judge(self.drawn)
                self.drawn = None
                if contradicted is None:
                    points = {s.name: cover(s, self.fits[s.name].models) for s in self.spaces}
                    self.result = Classified({n: f.models for n, f in self.fits.items()}, points, self.calls,
                                             self.checked)
                    return []
                log.info("shape classes: a check contradicted the models (%s); sampling more", contradicted)
            if self.rounds_left == 0:
                raise Unexplained("the models were still contradicted after every round of sampling")
            self.rounds_left -= 1
            self.fits = {s.name: fit(self.observations[s.name], s, self.pools[s.name], self.known[s.name])
                         for s in self.spaces}
            asks = self._new(p for name, f in self.fits.items() for p in f.asks
                             if p not in self.observations[name].points)
            if asks:
                return asks
            self.drawn = {s.name: [p for p in s.random_points(self.checks, self.rng)
                                   if p not in self.observations[s.name].points] for s in self.spaces}
            checks = self._new(p for points in self.drawn.values() for p in points)
            if checks:
                return checks

    def _judge(self, drawn: dict[str, list[Point]]) -> str | None:
        contradicted = None
        for space in self.spaces:
            for point in drawn[space.name]:
                why = agrees(self.fits[space.name].models, point, self.observations[space.name].observed(point))
                self.checked += why is None
                contradicted = contradicted or (why and f"{space.name} {point}: {why}")
        return contradicted


def classify_all(problems: list[Problem], *, seed: int, checks: int = 6, rounds: int = 40,
                 stop: Callable[[], bool] = lambda: False,
                 sample_all: Callable[[list], list] | None = None) -> list[Classified | Unexplained]:
    """Explain every site of every problem's spaces from calls at a few points, and the points that reach
    every class: per problem, its Classified, or the Unexplained saying why it has none (the others go on).
    The rounds of all problems are made together: ``sample_all(items)`` makes a batch of calls, each item a
    ``(problem index, point)`` (default: one after the other, here)."""
    searches = [_Search(problem.spaces, random.Random(seed + index), checks, rounds)
                for index, problem in enumerate(problems)]
    outcome: list[Classified | Unexplained] = [Unexplained("not searched")] * len(problems)
    sample_all = sample_all or (lambda items: [problems[i].sample(p) for i, p in items])
    wanted = {index: search.asked for index, search in enumerate(searches)}
    while wanted:
        if stop():
            for index in wanted:
                outcome[index] = Unexplained("planning was cancelled")
            break
        items = [(index, point) for index, points in wanted.items() for point in points]
        for (index, point), found in zip(items, sample_all(items)):
            searches[index].take(point, found)
        following = {}
        for index in wanted:
            try:
                points = searches[index].advance()
            except Unexplained as exc:
                outcome[index] = exc
                continue
            if points:
                following[index] = points
            else:
                outcome[index] = searches[index].result
        wanted = following
    return outcome


def search(problems: list[Problem], *, stop: Callable[[], bool] = lambda: False,
           workers: int | None = None) -> list[Classified | None]:
    """``classify_all`` for a planner: a new seed each run, in a process forked from this thread (its
    sampling and model fitting would hold the server's GIL for seconds), each round's calls spread over
    ``workers`` processes forked from that one (default: ``JIT_AHEAD_PLANNERS``), and one log line per
    problem: the calls chosen, or that it is planned at every shape and why (None)."""
    from . import forked_planning

    def sample(item: tuple[int, Point]) -> dict[str, list]:
        index, point = item
        return problems[index].sample(point)

    seed = random.SystemRandom().randrange(1 << 32)
    found = forked_planning.call_in_child(
        lambda: classify_all(problems, seed=seed, stop=stop,
                             sample_all=lambda items: forked_planning.call_all(sample, items, workers)),
        stop=stop, cancelled=lambda: [Unexplained("planning was cancelled")] * len(problems))
    results: list[Classified | None] = []
    for index, (problem, outcome) in enumerate(zip(problems, found)):
        if isinstance(outcome, Unexplained):
            log.warning("%s is planned at every shape (%s); shape classes seed %d", problem.who, outcome,
                        seed + index)
            results.append(None)
            continue
        chosen = len({p for points in outcome.points.values() for p in points})
        log.info("%s: %d calls reach every shape class (%d sampled, %d checked at random; seed %d)", problem.who,
                 chosen, outcome.calls, outcome.checked, seed + index)
        results.append(outcome)
    return results


def search_parts(parts: list[tuple[object, Problem]], sampled: dict[str, int],
                 stop: Callable[[], bool] = lambda: False) -> dict[object, list[Point] | None]:
    """``search`` of problems of one space each, named by a part key: per key, the points of its space
    that reach every class, or None (every point, one line said why). ``sampled`` gets each explained
    problem's call count, by who."""
    found = search([problem for _, problem in parts], stop=stop) if parts else []
    sampled.update({problem.who: f.calls for (_, problem), f in zip(parts, found) if f is not None})
    return {part: None if f is None else list(f.points[problem.spaces[0].name])
            for (part, problem), f in zip(parts, found)}
