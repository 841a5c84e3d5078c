"""The README's peer table and its words against the committed runs (#76 item 6): every ratio cell of the README's
"Against ModelOpt's auto_quantize" table is the figure docs/modelopt.md's run transcripts print (rounded to two
places), and the sentence naming what is measurably below or above ModelOpt gradient names exactly the cells whose
paired 90 % interval (the transcripts' three places) lies wholly under or over 1 — no more, no fewer."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "modelopt.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")

COLUMNS = ("aumann_shapley", "default", "exact", "headroom")  # the README table's columns after the row's name
ROWS = {  # the README's row name -> which run transcript holds the row, per column (None: "not run")
    "SmolLM2, 16": {
        "aumann_shapley": ("S16", "ModelOpt aumann_shapley"),
        "default": ("S16", "default path (sweep, recipe)"),
        "exact": ("S16", "exact, single, refine 0"),
        "headroom": ("S16", "headroom (60 measured)"),
    },
    "SmolLM2, 128": {
        "aumann_shapley": ("S128", "ModelOpt aumann_shapley"),
        "default": ("S128-final", "default path (sweep, recipe)"),  # the run its time (0.90-0.99x) is from
        "exact": ("S128-exact", "exact, single, refine 0"),
        "headroom": ("S128-headroom", "headroom (41 measured)"),
    },
    "Gemma, 16": {
        "aumann_shapley": ("G16", "ModelOpt aumann_shapley"),
        "default": ("G16", "default path (sweep, recipe)"),
        "exact": ("G16", "exact, single, refine 0"),
        "headroom": None,  # the earlier run's, quoted in prose (below)
    },
    "Gemma, 128": {
        "aumann_shapley": ("G128", "ModelOpt aumann_shapley"),
        "default": ("G128", "default path (sweep, recipe)"),
        "exact": None,
        "headroom": None,
    },
}
# the transcripts, each told by what it alone holds
BLOCKS = {
    "S16": lambda b: "ModelOpt aumann_shapley:8" in b,
    "S128": lambda b: "smollm2-135m; every tool searches on the sweep's 128" in b and "aumann_shapley" in b,
    "S128-rerun": lambda b: (
        "smollm2-135m; every tool searches on the sweep's 128" in b
        and "aumann_shapley" not in b
        and "exact, single" not in b
    ),
    "S128-exact": lambda b: "smollm2-135m; every tool searches on the sweep's 128" in b and "exact, single" in b,
    "S128-headroom": lambda b: "headroom (41 measured)" in b,
    "G16": lambda b: "exact, context, refine 0" in b,
    "G128": lambda b: "ModelOpt aumann_shapley" in b and "5.486" in b,
}
# cells the docs give in prose only, from the earlier Gemma run at 16 prompts: (value, interval or None), each
# with the words of docs/modelopt.md it is read from
PROSE = {
    ("Gemma, 16", "exact", "14.5"): ((1.17, (1.03, 1.36)), "1.17× [1.03, 1.36]"),
    ("Gemma, 16", "exact", "13.75"): ((1.11, (0.95, 1.27)), "1.11× [0.95,\n  1.27]"),
    ("Gemma, 16", "headroom", "15.25"): (
        (0.89, None),
        "| Gemma 3 270M, 15.25 | 0.866 [0.740, 1.012] | 0.984 [0.894, 1.077] | 0.89 |",
    ),
    ("Gemma, 16", "headroom", "14.5"): ((1.20, (1.08, 1.36)), "1.20×\n  [1.08, 1.36]"),
    ("Gemma, 16", "headroom", "13.75"): ((1.11, None), "1.20× and 1.11× for the headroom of 60"),
}
RATIO = re.compile(
    r"^\s*(\S.*?\S)\s{2,}\d+\s+[\d.]+\s+[\d.]+\s+.*\s([\d.]+) \[([\d.]+), ([\d.]+)\]\s+[\d.]+ \[[\d.]+, [\d.]+\]\s+\d+$"
)


FINAL = "(266.4 + 59.2)"  # the last SmolLM2-128 rerun of the default path (fair-128-d), a markdown table


def final_run() -> dict[tuple[str, str], tuple[float, float, float]]:
    """The last default-path rerun at 128 prompts (a markdown table): (bits, row) -> its simulated ratio, interval."""
    start = DOCS.index(FINAL)
    table = DOCS[DOCS.rindex("\n\n", 0, start) : DOCS.index("\n\n", start)]
    rows = {}
    for line in table.strip().splitlines()[2:]:  # after the header and its rule
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", cells[4])
        rows[(cells[0], "default path (sweep, recipe)")] = tuple(float(x) for x in m.groups())
    return rows


def transcripts() -> dict[str, dict[tuple[str, str], tuple[float, float, float]]]:
    """Each named transcript's (bits, row) -> its simulated ratio to gradient and that ratio's interval."""
    blocks = [b for b in re.findall(r"```\n(.*?)```", DOCS, re.S) if "ratio sim" in b]
    out = {"S128-final": final_run()}
    for name, holds in BLOCKS.items():
        (block,) = [b for b in blocks if holds(b)]  # exactly one transcript each
        rows, bits = {}, None
        for line in block.splitlines():
            m = re.match(r"([\d.]+) effective bits$", line)
            if m:
                bits = m.group(1)
                continue
            m = RATIO.match(line)
            if m:
                rows[(bits, m.group(1))] = tuple(float(x) for x in m.group(2, 3, 4))
        out[name] = rows
    return out


def readme_table() -> dict[tuple[str, str, str], str]:
    """(row, column, bits) -> the README cell's text."""
    cells = {}
    for line in README.splitlines():
        m = re.match(r"\| (SmolLM2-135M|Gemma 3 270M), (\d+), ([\d. /]+) \| (.*) \|$", line)
        if not m:
            continue
        row = f"{'SmolLM2' if m.group(1).startswith('Smol') else 'Gemma'}, {m.group(2)}"
        bits = [b.strip() for b in m.group(3).split("/")]
        for column, text in zip(COLUMNS, m.group(4).split(" | ")):
            parts = [t.strip() for t in text.split(" / ")] if len(bits) > 1 else [text.strip()]
            for b, part in zip(bits, parts):
                cells[(row, column, b)] = part
    return cells


def figures() -> dict[tuple[str, str, str], tuple[float, tuple | None]]:
    """(row, column, bits) -> (ratio, interval or None) from the committed runs, for every README cell with one."""
    runs, out = transcripts(), {}
    for (row, column, bits), text in readme_table().items():
        if text == "not run":
            continue
        if (row, column, bits) in PROSE:
            (value, interval), words = PROSE[(row, column, bits)]
            assert words in DOCS, f"docs/modelopt.md no longer says {words!r}"
            out[(row, column, bits)] = (value, interval)
            continue
        where = ROWS[row][column]
        if where is None:
            continue
        r, lo, hi = runs[where[0]][(bits, where[1])]
        out[(row, column, bits)] = (r, (lo, hi))
    return out


def claims() -> dict[str, set[tuple[str, str, str]]]:
    """The README sentence's cells, by side: 'below' before "Above it:", 'above' after; each group `COLUMN BITS[,
    BITS ...][, COLUMN BITS ...] (STUDENT, PROMPTS)`."""
    words = " ".join(README.split())  # whatever the line breaks
    m = re.search(r"Measurably below gradient \(.*?\): (.*?)\. Above it: (.*?)\. The rest is within its noise", words)
    assert m, "the README's sentence on what is measurably below or above gradient is gone"
    out = {}
    for side, text in (("below", m.group(1)), ("above", m.group(2))):
        cells = set()
        for group in " ".join(text.split()).split("; "):
            g = re.fullmatch(r"(.*) \((SmolLM2|Gemma), (\d+)\)", group)
            assert g, group
            column = None
            for token in g.group(1).split(", "):
                words = token.split()
                if len(words) == 2:
                    column, bits = words
                else:
                    (bits,) = words
                assert column in COLUMNS, token
                cells.add((f"{g.group(2)}, {g.group(3)}", column, bits))
        out[side] = cells
    return out


def two(x: float) -> str:
    """The transcript's printed figure to two places, halves up (0.055 -> 0.06), as a reader rounds it."""
    return str(Decimal(repr(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def test_every_readme_peer_cell_is_the_committed_runs_figure():
    """Each cell the README rounds (ratio and interval ends) equals docs/modelopt.md's transcript or quoted figure."""
    table, got = readme_table(), figures()
    assert len(table) == 44, len(table)  # 6 SmolLM2 rows x 4 columns, Gemma's 12 at 16, at 128 6 and two "not run"
    for key, (value, interval) in got.items():
        text = table[key]
        want = two(value) + (f" [{two(interval[0])}, {two(interval[1])}]" if interval and "[" in text else "")
        assert text == want, (key, text, want)
    unsourced = {k: v for k, v in table.items() if k not in got and v != "not run"}
    assert not unsourced, unsourced


def test_the_readme_names_exactly_the_measurable_cells():
    """What the sentence calls measurably below (above) gradient is every cell whose interval lies under (over) 1."""
    got = figures()
    below = {k for k, (_, i) in got.items() if i and i[1] < 1}
    above = {k for k, (_, i) in got.items() if i and i[0] > 1}
    said = claims()
    assert said["below"] == below, (sorted(said["below"] - below), sorted(below - said["below"]))
    assert said["above"] == above, (sorted(said["above"] - above), sorted(above - said["above"]))
