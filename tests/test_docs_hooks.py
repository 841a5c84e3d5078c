"""The docs' settings tables (scripts/docs_hooks.py) list what a user sets: every field with its flag, and no field
a Settings derives from another (CheckSettings.verl and PlanSettings.verl are `verl_async` parsed)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "docs_hooks", Path(__file__).resolve().parents[1] / "scripts" / "docs_hooks.py"
)
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


@pytest.mark.parametrize("path", ["fp8probe.budget.settings.CheckSettings", "fp8probe.planning.plan.PlanSettings"])
def test_settings_tables_list_what_a_user_sets_and_nothing_derived(path):
    """Seen failing with derived fields listed (the table showed `verl`, with no flag)."""
    rows = {
        ln.split("|")[1].strip(): ln.split("|")[2].strip()
        for ln in hooks.settings_table(path).splitlines()
        if ln.startswith("| `")
    }
    assert rows["`verl_async`"] == "`--verl-async`"
    assert "`verl`" not in rows
