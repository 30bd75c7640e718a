"""Every pair of values, in few rows: a small deterministic pairwise (all-pairs) generator.

Greedy, in the manner of AETG: each new row starts from the first pair not yet covered and
takes, dimension by dimension, the value that covers the most pairs still uncovered (ties go
to the earlier value), among the rows the constraint allows. Pairs the constraint forbids
are not asked for. The same dimensions always give the same rows, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations, product

Row = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]  # ((dimension, value), (dimension, value))


def _pairs(row: Mapping[str, str], names: Sequence[str]) -> set[Pair]:
    present = [name for name in names if name in row]
    return {((a, row[a]), (b, row[b])) for a, b in combinations(present, 2)}


def all_pairs(dimensions: Mapping[str, Sequence[str]], allowed: Callable[[Row], bool]) -> set[Pair]:
    """The pairs of values that some allowed row can hold."""
    names = list(dimensions)
    wanted = set()
    for a, b in combinations(names, 2):
        for x, y in product(dimensions[a], dimensions[b]):
            if allowed({a: x, b: y}):
                wanted.add(((a, x), (b, y)))
    return wanted


def pairwise(
    dimensions: Mapping[str, Sequence[str]], allowed: Callable[[Row], bool] = lambda _: True
) -> list[Row]:
    """Rows (one value per dimension) that together hold every allowed pair of values.
    `allowed` judges a partial row: it must refuse any row holding a forbidden pair."""
    names = list(dimensions)
    uncovered = all_pairs(dimensions, allowed)
    rows: list[Row] = []
    while uncovered:
        (a, x), (b, y) = min(uncovered, key=lambda pair: _order(pair, dimensions))
        row: Row = {a: x, b: y}
        for name in names:
            if name in row:
                continue
            choices = [v for v in dimensions[name] if allowed({**row, name: v})]
            if not choices:
                raise ValueError(f"no value of {name} fits {row}")
            row[name] = max(
                choices,
                key=lambda v: (
                    len(_pairs({**row, name: v}, names) & uncovered),
                    -list(dimensions[name]).index(v),
                ),
            )
        rows.append({name: row[name] for name in names})
        uncovered -= _pairs(row, names)
    return rows


def _order(pair: Pair, dimensions: Mapping[str, Sequence[str]]) -> tuple[int, ...]:
    """Pairs in the order of their dimensions and values, as given."""
    names = list(dimensions)
    (a, x), (b, y) = pair
    return (
        names.index(a),
        names.index(b),
        list(dimensions[a]).index(x),
        list(dimensions[b]).index(y),
    )
