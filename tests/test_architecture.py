"""The package's shape, as rules the code must keep: layers as folders, each importing only from its own layer or
below; no import cycle between modules; no module importing another module's private name; a thin CLI; short
functions. Read from the source (ast), every import counted, function-level ones too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fp8probe"
# bottom to top: a module may import from its own layer and the layers before it
LAYERS = (
    "core",
    "model",
    "measurement",
    "sweeps",
    "recipe",
    "deploy",
    "sources",
    "budget",
    "plots",
    "training",
    "planning",
    "apps",
    "cli",
)
# the size caps count statements (logical lines: a statement split over several physical lines by `ruff format`
# counts once, a compound statement's header once), so the formatter's layout moves none of them
MAX_FUNCTION_STATEMENTS = 60  # about the 80 physical lines the cap was before the formatter (the largest: 57)
LONG_FUNCTIONS: dict[str, str] = {}  # "module:function" -> why it may be longer (none)
MAX_PARAMETERS = 8  # a public function takes its inputs and a settings object, not a settings object's fields
MAX_CLI_STATEMENTS = 220  # the 400 physical lines before the formatter held 216
MAX_APP_STATEMENTS = 80  # an entry point per command: settings in, a result and its files out; the work lives below
MAX_APP_LINES = 150  # and at most this many physical lines a file, docstring included: a reader sees it whole
MAX_FLOORS = 11  # the tallest chain of layers one above another, the package's public API (fp8probe/) on top


def modules() -> dict[str, Path]:
    """Dotted module name below fp8probe ("core.errors", "cli", ...) -> file."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if "vllm_site" in parts:  # runs inside vLLM's own venv, imports no fp8probe
            continue
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, typing: bool = True) -> list[tuple[str, list[str], int]]:
    """(imported module below fp8probe, the names taken from it, line) for every import of fp8probe code; without
    `typing`, not those under `if TYPE_CHECKING:` (annotations only: no edge at run time)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if name else []
    package = here if is_pkg else here[:-1]
    tree = ast.parse(path.read_text())
    skip = set()
    if not typing:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                skip |= {id(n) for b in node.body for n in ast.walk(b)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "fp8probe":
                target = node.module.partition(".")[2]
            else:
                continue
            out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fp8probe":
                    out.append((a.name.partition(".")[2], [], node.lineno))
    return out


def resolve(target: str, names: list[str], mods: dict[str, Path]) -> list[str]:
    """The modules an import reaches: `from pkg import mod` reaches pkg.mod when that is a module."""
    hits = [f"{target}.{n}" if target else n for n in names if (f"{target}.{n}" if target else n) in mods]
    return hits or [target]


def layer(mod: str) -> int | None:
    head = mod.split(".")[0]
    return LAYERS.index(head) if head in LAYERS else None


def graph(typing: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports; without `typing`, at run time only (type-only imports are no edge)."""
    mods = modules()
    return {
        m: {t for target, names, _ in imports(m, p, typing=typing) for t in resolve(target, names, mods) if t != m}
        for m, p in mods.items()
    }


def test_every_module_sits_in_a_layer():
    stray = [m for m in modules() if m and layer(m) is None]
    assert not stray, f"modules outside the layer folders {LAYERS}: {stray}"


def test_a_module_imports_only_from_its_own_layer_or_below():
    mods = modules()
    bad = []
    for m, p in mods.items():
        if not m:  # the package's own __init__: the public API, loaded lazily from every layer
            continue
        for target, names, line in imports(m, p):
            for t in resolve(target, names, mods):
                if t and layer(t) is not None and layer(t) > layer(m):
                    bad.append(
                        f"{p.relative_to(PKG.parent)}:{line} ({LAYERS[layer(m)]}) imports {t} ({LAYERS[layer(t)]})"
                    )
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def floors() -> dict[str, int]:
    """Layer -> its floor: 1 + the highest floor among the layers its modules import at run time (core: 1)."""
    below: dict[str, set[str]] = {x: set() for x in LAYERS}
    for m, targets in graph(typing=False).items():
        if m:
            below[m.split(".")[0]] |= {t.split(".")[0] for t in targets if t and layer(t) is not None} - {
                m.split(".")[0]
            }
    memo: dict[str, int] = {}

    def floor(x: str) -> int:
        if x not in memo:
            memo[x] = 1 + max((floor(y) for y in below[x]), default=0)
        return memo[x]

    return {x: floor(x) for x in LAYERS}


def test_the_house_is_no_tower():
    """At most MAX_FLOORS floors, the package's public API (fp8probe/__init__.py, over every layer) the top one: a
    layer imported by one module alone still lifts every layer above it (as drawing the calibration figure in
    training/ once lifted training/ above plots/), so a new climb has to be a decision."""
    f = floors()
    assert max(f.values()) + 1 <= MAX_FLOORS, f"{max(f.values()) + 1} floors: {sorted(f.items(), key=lambda kv: kv[1])}"


def test_no_import_cycle():
    """Not through imports for annotations either: a cycle hidden under `if TYPE_CHECKING:` is still a cycle."""
    g = graph()
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m) :] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if t in g:
                visit(t)
        stack.pop()

    for m in sorted(g):
        visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_a_private_name_of_another():
    mods = modules()
    bad = [
        f"{m}: {t}.{n}"
        for m, p in mods.items()
        for t, names, _ in imports(m, p)
        for n in names
        if n.startswith("_") and not n.startswith("__") and t != m
    ]
    assert not bad, bad


def statements(node: ast.AST) -> int:
    """The logical lines of `node`: every statement in it (nested ones too), however it is laid out."""
    return sum(isinstance(n, ast.stmt) for n in ast.walk(node))


def test_functions_are_short():
    long = []
    for m, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = statements(node)
                if n > MAX_FUNCTION_STATEMENTS and f"{m}:{node.name}" not in LONG_FUNCTIONS:
                    long.append(f"{m}:{node.name} ({n} statements)")
    assert not long, f"functions over {MAX_FUNCTION_STATEMENTS} statements: {long}"


def parameters(fn: ast.FunctionDef) -> int:
    """What a caller may pass: every named parameter (`self`/`cls` not counted), *args and **kwargs one each."""
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - bool(a.args and a.args[0].arg in ("self", "cls"))


def public_functions(tree: ast.AST):
    """Module-level functions and methods of classes whose names do not start with `_` (a public class's `__init__`
    counts)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from (f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")


def test_public_functions_take_few_parameters():
    """At most MAX_PARAMETERS, every public function: the rest travels as a settings object (`make_recipe(table,
    bench, settings, *, context)`, `run_vllm(model, serve, ...)`)."""
    over = []
    for m, p in modules().items():
        for fn in public_functions(ast.parse(p.read_text())):
            key, n = f"{m}:{fn.name}", parameters(fn)
            if n > MAX_PARAMETERS:
                over.append(f"{key} ({n})")
    assert not over, f"public functions over {MAX_PARAMETERS} parameters (take a settings object): {over}"


# the verbs that measure: each takes the bench it measures on (measurement/bench.py), never its parts
BENCH_VERBS = (
    "measurement.measure:measure",
    "measurement.measure:measure_scheme",
    "measurement.measure:measured_as",
    "sweeps.sweep:sweep",
    "sweeps.sweep:whole_model_rows",
    "recipe.selection:make_recipe",
    "recipe.agreement:agreement",
    "budget.admission:check",
    "budget.admission:check_async",
    "budget.series:measure_point",
    "sources.ladder:ladder",
    "planning.plan:measure_costs",
    "planning.plan:plan",
)
BENCH_PARTS = {"student", "rollouts", "reference", "sampling", "batch_size"}


def test_the_verbs_that_measure_take_a_bench():
    """Each verb of BENCH_VERBS takes a `bench` and none of what a bench holds (a student, rollouts, a reference, the
    rollouts' settings, a batch size) beside it: one way in, the reference made once."""
    mods, bad = modules(), []
    for key in BENCH_VERBS:
        m, name = key.split(":")
        (fn,) = [
            f for f in ast.walk(ast.parse(mods[m].read_text())) if isinstance(f, ast.FunctionDef) and f.name == name
        ]
        names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        if "bench" not in names or names & BENCH_PARTS:
            bad.append(f"{key} ({', '.join(sorted(names & BENCH_PARTS)) or 'no bench'})")
    assert not bad, f"verbs that measure without a bench, or with its parts beside it: {bad}"


def test_verdicts_are_one_enum():
    """A verdict is budget/evidence.py's Verdict everywhere in the package: no module spells ADMIT, REJECT or UNCERTAIN
    as a string of its own to compare or return (a sentence that names one, in a docstring or a message, is words)."""
    names, spelled = {"ADMIT", "REJECT", "UNCERTAIN"}, []
    for m, p in modules().items():
        if m == "budget.evidence":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                spelled.append(f"{m}:{node.lineno}")
    assert not spelled, f"verdicts spelled as strings (use budget.evidence.Verdict): {spelled}"


def test_every_settings_class_lives_below_apps():
    """A Settings class sits beside the verb that owns it (recipe/settings.py, budget/settings.py, ...), so the
    library's verbs take it whole; apps/ and cli/ only build them and resolve what lies above a layer (the framework
    target: deploy.frameworks.TargetSettings)."""
    bad = []
    for m, p in modules().items():
        if m.split(".")[0] in ("apps", "cli"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Settings" for b in node.bases):
                    bad.append(f"{m}:{node.name}")
    assert not bad, f"Settings classes in apps/ or cli/: {bad}"


def test_the_cli_is_thin():
    total = sum(statements(ast.parse(p.read_text())) for p in (PKG / "cli").glob("*.py"))
    assert total <= MAX_CLI_STATEMENTS, f"cli/ holds {total} statements; parse flags into settings and call the library"


def test_the_entry_points_are_thin():
    """apps/ holds one entry point per command, each file at most MAX_APP_STATEMENTS statements and MAX_APP_LINES
    lines, and no training
    code: the trainers, the calibration runs and the dose measurements live in training/, the mismatch sources in
    sources/."""
    long, training = [], []
    for p in sorted((PKG / "apps").glob("*.py")):
        tree = ast.parse(p.read_text())
        if statements(tree) > MAX_APP_STATEMENTS:
            long.append(f"{p.name} ({statements(tree)} statements)")
        if len(p.read_text().splitlines()) > MAX_APP_LINES:
            long.append(f"{p.name} ({len(p.read_text().splitlines())} lines)")
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            module = getattr(node, "module", None) or ""
            if any(n.split(".")[0] == "trl" for n in names) or module.split(".")[0] == "trl":
                training.append(f"{p.name} imports trl")
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and "train" in node.name.lower():
                training.append(f"{p.name} defines {node.name}")
    assert not long, f"apps/ files over {MAX_APP_STATEMENTS} statements or {MAX_APP_LINES} lines: {long}"
    assert not training, f"training code in apps/: {training}"


def test_every_entry_point_returns_a_result():
    """One contract: each run_x of apps/ is annotated to return a core.results.Result (what it made, `out`,
    `exit_code`, `describe(seconds)`), and the CLI prints that and exits with it (cli/main.py)."""
    import importlib
    import inspect
    import typing

    from fp8probe.core.results import Result
    from fp8probe.deploy import export

    found, bad = [], []
    for p in sorted((PKG / "apps").glob("*.py")):
        mod = importlib.import_module(f"fp8probe.apps.{p.stem}")
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if name.startswith("run_") and fn.__module__ == mod.__name__:
                found.append(name)
                ret = typing.get_type_hints(fn, {**vars(export), **vars(mod)}).get("return")
                if not (inspect.isclass(ret) and issubclass(ret, Result)):
                    bad.append(f"{p.stem}.{name} -> {ret}")
    assert len(found) >= 12 and not bad, bad


def test_the_public_api_names_each_concept_at_its_one_home():
    """`fp8probe.X` is the object defined in the module _HOMES names (not a re-export found elsewhere), and every
    public name resolves; importing the package loads no torch (names load on first use)."""
    import importlib
    import subprocess
    import sys

    import fp8probe

    for name, home in fp8probe._HOMES.items():
        obj = getattr(fp8probe, name)
        defined = getattr(obj, "__module__", None)
        if defined is not None and not isinstance(obj, (list, dict)):
            assert defined == f"fp8probe.{home}", f"fp8probe.{name} is defined in {defined}, not fp8probe.{home}"
        else:  # a constant: it must be assigned in its home module
            assert name in (PKG / (home.replace(".", "/") + ".py")).read_text(), name
        assert getattr(importlib.import_module(f"fp8probe.{home}"), name) is obj
    code = "import sys, fp8probe; assert 'torch' not in sys.modules, 'import fp8probe loaded torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_benchmarks_tests_and_notebooks_import_names_that_exist():
    """Every `from fp8probe... import name` in benchmarks/, tests/, scripts and the notebooks resolves: moving a
    name must move its users (the benchmarks are not run by the suite)."""
    import importlib
    import json

    root = PKG.parent
    sources = [(p, p.read_text()) for d in ("benchmarks", "tests", ".ci") for p in (root / d).rglob("*.py")]
    for nb in (root / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        sources.append((nb, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")))
    missing = []
    for path, src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "fp8probe":
                mod = importlib.import_module(node.module)
                for a in node.names:
                    if not hasattr(mod, a.name):
                        try:
                            importlib.import_module(f"{node.module}.{a.name}")
                        except ImportError:
                            missing.append(f"{path.relative_to(root)}: {node.module}.{a.name}")
    assert len(sources) > 40 and not missing, missing


def test_tests_mirror_the_packages():
    """tests/<layer>/ holds the tests of fp8probe/<layer>/: every folder of tests is a layer (or robustness/, every
    command on bad input), and every layer has one."""
    root = PKG.parent / "tests"
    folders = {p.parent.name for p in root.rglob("test_*.py") if p.parent != root}
    assert folders - set(LAYERS) <= {"robustness"}, sorted(folders - set(LAYERS))
    assert set(LAYERS) <= folders, sorted(set(LAYERS) - folders)


def registries() -> dict[str, str]:
    """Registry name -> its module: module-level UPPERCASE tables looked up by name, i.e. annotated `dict[str, ...]`
    or built as `{x.name: x for x in ...}`."""
    out = {}
    for m, p in modules().items():
        for node in ast.parse(p.read_text()).body:
            target = (
                node.target
                if isinstance(node, ast.AnnAssign)
                else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            )
            name = getattr(target, "id", "")
            if not name.isupper() or name.startswith("_"):
                continue
            ann = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else ""
            if ann.startswith("dict[str") or isinstance(node.value, ast.DictComp):
                out[name] = m
    return out


def test_the_docs_name_every_entry_point_and_registry():
    """docs/library.md and docs/architecture.md name every entry point (`run_*` of apps/), and fp8probe's public API
    holds each; docs/architecture.md names every registry with its module, so a new one cannot land unseen."""
    import importlib
    import inspect

    import fp8probe

    docs = PKG.parent / "docs"
    library, architecture = (docs / "library.md").read_text(), (docs / "architecture.md").read_text()
    entry = [
        name
        for p in sorted((PKG / "apps").glob("*.py"))
        for name, fn in inspect.getmembers(importlib.import_module(f"fp8probe.apps.{p.stem}"), inspect.isfunction)
        if name.startswith("run_") and fn.__module__ == f"fp8probe.apps.{p.stem}"
    ]
    assert len(entry) >= 15
    missing = [f"{n} (library.md)" for n in entry if f"`{n}`" not in library]
    missing += [f"{n} (architecture.md)" for n in entry if f"`{n}`" not in architecture]
    missing += [f"{n} (fp8probe.__all__)" for n in entry if n not in fp8probe.__all__]
    regs = registries()
    assert {"ENGINES", "TARGETS", "FORMS", "METHODS", "COMMANDS"} <= set(regs), regs
    missing += [
        f"{r} ({m}, architecture.md)"
        for r, m in regs.items()
        if f"`{r}`" not in architecture or f"`{m.replace('.', '/')}.py`" not in architecture
    ]
    assert not missing, f"not named in the docs: {missing}"


def test_the_records_the_cli_and_the_sources_name_load_no_torch():
    """`Perturbation` is a record (measurement/perturbation.py, torch-free): the sources, the shortcuts and the
    command table name it at import without loading torch; the student under it is measurement/perturbed.py's."""
    import subprocess
    import sys

    code = (
        "import sys; import fp8probe.measurement.perturbation, fp8probe.sources.sources, fp8probe.cli.commands; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False", "importing the Perturbation record, the sources or the command table loaded torch"


def test_every_bare_record_field_says_what_it_holds():
    """A record's field (a Record subclass: one file's keys) typed as a bare dict or list, with no element types,
    states what it holds on its line or the line above it: a nested figure's owner, its keys, or why it is free-form.
    Fields with element types (list[float], dict[str, str]) speak for themselves."""
    bare_names = {"dict", "list"}
    silent = []
    for name, path in modules().items():
        src = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(src))):
            if not isinstance(node, ast.ClassDef) or not any(ast.unparse(b).endswith("Record") for b in node.bases):
                continue
            for s in node.body:
                if not isinstance(s, ast.AnnAssign):
                    continue
                parts = {p.strip() for p in ast.unparse(s.annotation).split("|")}
                said = "#" in src[s.lineno - 1] or src[s.lineno - 2].strip().startswith("#")
                if parts & bare_names and not said:
                    silent.append(f"{name}:{node.name}.{s.target.id}")
    assert not silent, f"bare dict/list record fields that do not say what they hold: {silent}"


def test_one_table_of_kv_dtypes():
    """Every KV-cache dtype is one entry of core/schemes.py's KV_DTYPES (its bytes, its FP8 format, its inline scales,
    its recipe scheme), and every other table of them is a view computed from it: a dict, set or tuple literal naming
    two or more KV dtypes anywhere else in the package is a second table."""
    from fp8probe.core.schemes import KV_DTYPES

    names = {n for n, d in KV_DTYPES.items() if d.element_bytes != 2 and d.element_bytes is not None}  # not torch's
    tables = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, (ast.Dict, ast.Set, ast.Tuple, ast.List)) or items is None:
                continue
            listed = {k.value for k in items if isinstance(k, ast.Constant) and k.value in names}
            if len(listed) >= 2:
                tables.append(f"{name}:{node.lineno} {sorted(listed)}")
    assert not tables, f"KV dtypes tabled outside core/schemes.py's KV_DTYPES: {tables}"
