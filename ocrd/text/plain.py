"""A block's text as the plain words a reader searches for: Markdown without its markup,
an HTML table a line per row, LaTeX formulas as the symbols they show. The searchable
PDF's invisible text is made of these lines."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from ocrd.text.grounding import Block
from ocrd.text.markdown import scrub_tags

FORMULA_LABELS = frozenset({"equation", "formula", "isolate_formula", "interline_equation"})


class _TableText(HTMLParser):
    """An HTML table as rows of text: cells of a row joined by spaces."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = [[]]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr" and any(self.rows[-1]):
            self.rows.append([])
        elif tag in ("td", "th", "br"):
            self.rows[-1].append(" ")

    def handle_data(self, data: str) -> None:
        self.rows[-1].append(data)


def table_rows(table: str) -> list[str]:
    """The rows of an HTML table (complete or cut off) as lines of cell texts."""
    reader = _TableText()
    reader.feed(table)
    reader.close()
    return [line for row in reader.rows if (line := " ".join("".join(row).split()))]


_SYMBOLS = {
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "epsilon": "ε",
    "varepsilon": "ε",
    "zeta": "ζ",
    "eta": "η",
    "theta": "θ",
    "vartheta": "θ",
    "iota": "ι",
    "kappa": "κ",
    "lambda": "λ",
    "mu": "μ",
    "nu": "ν",
    "xi": "ξ",
    "pi": "π",
    "rho": "ρ",
    "sigma": "σ",
    "tau": "τ",
    "upsilon": "υ",
    "phi": "φ",
    "varphi": "φ",
    "chi": "χ",
    "psi": "ψ",
    "omega": "ω",
    "Gamma": "Γ",
    "Delta": "Δ",
    "Theta": "Θ",
    "Lambda": "Λ",
    "Xi": "Ξ",
    "Pi": "Π",
    "Sigma": "Σ",
    "Phi": "Φ",
    "Psi": "Ψ",
    "Omega": "Ω",
    "times": "×",
    "cdot": "·",
    "div": "÷",
    "pm": "±",
    "mp": "∓",
    "leq": "≤",
    "le": "≤",
    "geq": "≥",
    "ge": "≥",
    "neq": "≠",
    "ne": "≠",
    "approx": "≈",
    "equiv": "≡",
    "sim": "~",
    "infty": "∞",
    "sum": "∑",
    "prod": "∏",
    "int": "∫",
    "oint": "∮",
    "partial": "∂",
    "nabla": "∇",
    "rightarrow": "→",
    "to": "→",
    "leftarrow": "←",
    "Rightarrow": "⇒",
    "Leftrightarrow": "⇔",
    "in": "∈",
    "notin": "∉",
    "subset": "⊂",
    "subseteq": "⊆",
    "cup": "∪",
    "cap": "∩",
    "forall": "∀",
    "exists": "∃",
    "neg": "¬",
    "land": "∧",
    "lor": "∨",
    "degree": "°",
    "circ": "∘",
    "ldots": "…",
    "cdots": "⋯",
    "dots": "…",
    "prime": "′",
    "star": "⋆",
    "langle": "⟨",
    "rangle": "⟩",
    "propto": "∝",
    "perp": "⊥",
    "angle": "∠",
    "sqrt": "√",
    "%": "%",
    "$": "$",
    "&": "&",
    "#": "#",
    "_": "_",
    "{": "{",
    "}": "}",
}
_TEXT_COMMANDS = frozenset(
    {
        "text",
        "textrm",
        "textbf",
        "textit",
        "mathrm",
        "mathbf",
        "mathit",
        "mathsf",
        "mathtt",
        "mathcal",
        "mathbb",
        "mathfrak",
        "boldsymbol",
        "operatorname",
        "mbox",
        "hat",
        "bar",
        "vec",
        "tilde",
        "dot",
        "overline",
        "underline",
        "widehat",
        "widetilde",
    }
)
_SPACES = frozenset({",", ";", ":", "!", " ", "quad", "qquad", "enspace", "thinspace"})
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}(?:\s*\{[^{}]*\})?")
_LATEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|.", re.DOTALL)  # a command, an escape, a character


def latex_to_plain(latex: str) -> str:
    """A formula as the text a reader would search for: commands become their symbols or
    disappear, fractions read a/b, groups lose their braces; ^ and _ stay."""
    tokens = _LATEX_TOKEN.findall(_ENVIRONMENT.sub(" ", latex))
    text, _ = _latex_sequence(tokens, 0, closing=False)
    return " ".join(text.split())


def _latex_sequence(tokens: list[str], index: int, closing: bool) -> tuple[str, int]:
    """Text of tokens from `index` up to the matching "}" (if `closing`) or the end."""
    parts: list[str] = []
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "}":
            if closing:
                break
            continue
        if token == "{":
            group, index = _latex_sequence(tokens, index, closing=True)
            parts.append(group)
        elif token in ("&", "~"):
            parts.append(" ")
        elif token == "\\\\":
            parts.append("\n")
        elif token.startswith("\\"):
            text, index = _latex_command(token[1:], tokens, index)
            parts.append(text)
        else:
            parts.append(token)
    return "".join(parts), index


def _latex_argument(tokens: list[str], index: int) -> tuple[str, int]:
    """The next argument: a braced group, a command, or a single character."""
    while index < len(tokens) and tokens[index].isspace():
        index += 1
    if index >= len(tokens) or tokens[index] == "}":
        return "", index
    if tokens[index] == "{":
        return _latex_sequence(tokens, index + 1, closing=True)
    if tokens[index].startswith("\\"):
        return _latex_command(tokens[index][1:], tokens, index + 1)
    return tokens[index], index + 1


def _latex_command(name: str, tokens: list[str], index: int) -> tuple[str, int]:
    if name == "frac" or name in ("dfrac", "tfrac"):
        numerator, index = _latex_argument(tokens, index)
        denominator, index = _latex_argument(tokens, index)
        return f"{numerator}/{denominator}", index
    if name == "sqrt":
        radicand, index = _latex_argument(tokens, index)
        return f"√{radicand}", index
    if name in _TEXT_COMMANDS:
        return _latex_argument(tokens, index)
    if name in _SPACES:
        return " ", index
    if name in _SYMBOLS:
        return f" {_SYMBOLS[name]} " if len(name) > 1 else _SYMBOLS[name], index
    return "", index  # \left, \right, \displaystyle, sizes, unknown commands: no text


_MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]|\$\$(.+?)\$\$", re.DOTALL)
_TABLE = re.compile(r"<table\b.*?(?:</table>|\Z)", re.DOTALL | re.IGNORECASE)
_BREAK = re.compile(r"<\s*br\s*/?\s*>", re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_BULLET = re.compile(r"^\s*[-*+•]\s+")
_RULE = re.compile(r"^\s*(?:(?:\*\s*){3,}|(?:-\s*){3,}|(?:_\s*){3,})$")
_PIPE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EMPHASIS = re.compile(r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>])")


def markdown_line_to_plain(line: str) -> str:
    """One line of Markdown without its markup: headings, quotes, bullets, emphasis, links,
    code marks, pipe-table bars and escapes."""
    if _RULE.match(line) or _PIPE_SEPARATOR.match(line):
        return ""
    line = _BULLET.sub("", _QUOTE.sub("", _HEADING.sub("", line)))
    if line.lstrip().startswith("|"):
        line = " ".join(cell.strip() for cell in re.split(r"(?<!\\)\|", line))
    line = _LINK.sub(r"\1", _IMAGE.sub(r"\1", line))
    line = _EMPHASIS.sub(r"\2", _STRONG.sub(r"\2", line)).replace("`", "")
    return " ".join(_ESCAPE.sub(r"\1", line).split())


def _math_to_plain(match: re.Match[str]) -> str:
    return latex_to_plain(next(group for group in match.groups() if group is not None))


def block_lines(block: Block) -> list[str]:
    """A block's text as plain lines: a table a line per row, a formula as plain text."""
    if block.label == "image":
        return []
    text = scrub_tags(block.content)
    if block.label in FORMULA_LABELS:
        text = _MATH.sub(_math_to_plain, text)
        text = latex_to_plain(text.replace("$$", " ")) if "\\" in text else text
    else:
        text = _MATH.sub(_math_to_plain, text)
    text = _TABLE.sub(lambda match: "\n" + "\n".join(table_rows(match.group(0))) + "\n", text)
    text = html.unescape(_TAG.sub("", _BREAK.sub("\n", text)))
    return [plain for line in text.split("\n") if (plain := markdown_line_to_plain(line))]
