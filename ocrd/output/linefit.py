"""A page's words shared out over the text lines found on its image, in reading order,
for a model that writes its text without positions (LightOnOCR-2, olmOCR-2; GLM-OCR and
PaddleOCR-VL without their layout stage).

Where the lines were also read (RapidOCR's recognition, rougher than the model's), the words
the two share, in order, say which line each of the model's words lies on (`by_reading`).
Otherwise the model's words, in the order it wrote them, are cut into runs, one run a line,
each as long as its line holds (`runs`): a line holds text in proportion to its width over
its type's height, and the page's text is scaled to the lines' total. Among cuts that do
that about equally well, those at the ends of the model's own lines win, so text whose
lines follow the page's falls on them line for line.

Pure arithmetic on words and numbers: which text and which lines is `textlayer.py`'s business.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

# What cutting inside one of the model's lines costs, in squared line lengths: a cut there
# wins only where the cut at the line's end would leave a run a fifth of a line too long.
MID_LINE_CUT = 0.05
# A share of the model's words that must be found among the words read on the image for
# those to place it.
MIN_ANCHORED = 0.5
PUNCTUATION = "\"'.,;:!?()[]{}<>«»„“”‘’*_#|`-"
MAX_RUN_PER_LINE = 3.0  # no run has more than three times the words its line holds, plus two


def runs(units: Sequence[float], ends: Sequence[bool], room: Sequence[float]) -> list[range]:
    """The words (their widths `units`, `ends`: whether the model's line ends after each)
    cut into one run per line (`room`: how much each holds, in any unit), in order; a run
    may be empty (a line of no text: a stamp, a line of a figure). Dynamic programming over
    (line, words so far), minimising the squared difference between each run's width and
    its line's share of the text, plus MID_LINE_CUT for each cut inside a model's line."""
    count, lines = len(units), len(room)
    if not count or not lines:
        return []
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(units, dtype=float))))
    total_room = float(sum(room)) or 1.0
    expected = np.asarray(room, dtype=float) * prefix[-1] / total_room
    scale = max(float(expected.mean()), 1.0)
    cut_cost = np.where(np.asarray([*ends[:-1], True], dtype=bool), 0.0, MID_LINE_CUT)
    cut_cost = np.concatenate(([0.0], cut_cost))  # before the first word: no cut
    mean_word = max(float(prefix[-1]) / count, 1e-6)
    widest = int(MAX_RUN_PER_LINE * float(expected.max()) / mean_word) + 2
    widest = min(count, max(widest, -(-count // lines)))  # every word has a line
    cost = np.full(count + 1, np.inf)
    cost[0] = 0.0
    choices = np.zeros((lines, count + 1), dtype=np.int64)
    for line in range(lines):
        best = cost + (expected[line] / scale) ** 2  # an empty run
        taken = np.zeros(count + 1, dtype=np.int64)
        for size in range(1, widest + 1):
            width = prefix[size:] - prefix[:-size]
            candidate = cost[:-size] + ((width - expected[line]) / scale) ** 2 + cut_cost[size:]
            better = candidate < best[size:]
            best[size:] = np.where(better, candidate, best[size:])
            taken[size:] = np.where(better, size, taken[size:])
        cost, choices[line] = best, taken
    return _back_track(choices, count)


def _back_track(choices: np.ndarray[Any, Any], count: int) -> list[range]:
    found: list[range] = []
    end = count
    for line in range(choices.shape[0] - 1, -1, -1):
        start = end - int(choices[line, end])
        found.append(range(start, end))
        end = start
    return found[::-1]


def _key(word: str) -> str:
    return word.strip(PUNCTUATION).casefold()


def by_reading(
    words: Sequence[str], lines: Sequence[Sequence[str]], ends: Sequence[bool] = ()
) -> list[int] | None:
    """For each of the model's `words`, the line it lies on, where the lines' own words
    (`lines`, as recognised on the image: rougher than the model's) say: words the two
    share, in order, anchor the model's words to lines (`_between` places the rest). None
    where fewer than MIN_ANCHORED of the model's words are anchored: the reading is too
    poor to say. `ends`: whether the model's own line ends after each word."""
    seen = [(_key(word), index) for index, line in enumerate(lines) for word in line]
    seen = [(key, index) for key, index in seen if key]
    keys = [_key(word) for word in words]
    wanted = [position for position, key in enumerate(keys) if key]
    matcher = difflib.SequenceMatcher(
        None, [keys[p] for p in wanted], [key for key, _ in seen], autojunk=False
    )
    anchors = {
        wanted[block.a + offset]: seen[block.b + offset][1]
        for block in matcher.get_matching_blocks()
        for offset in range(block.size)
    }
    if not anchors or len(anchors) < MIN_ANCHORED * len(words):
        return None
    return _between(anchors, len(words), ends)


def _between(anchors: dict[int, int], count: int, ends: Sequence[bool]) -> list[int]:
    """Every word's line from the anchored ones': before the first anchor its line, after
    the last its line; between two anchors on one line that line; between two on different
    lines, the words after the last end of a model's line among them go to the later line,
    and where the model's lines end nowhere there, each word to the nearer anchor's line."""
    positions = sorted(anchors)
    placed, line = [], anchors[positions[0]]
    for position in range(count):
        line = anchors.get(position, line)
        placed.append(line)
    for before, after in itertools.pairwise(positions):
        if anchors[before] == anchors[after]:
            continue
        split = next(
            (p + 1 for p in range(after - 1, before - 1, -1) if p < len(ends) and ends[p]),
            (before + after) // 2 + 1,
        )
        for position in range(before + 1, after):
            placed[position] = anchors[before] if position < split else anchors[after]
    return placed
