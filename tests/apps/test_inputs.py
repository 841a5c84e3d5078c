"""What every command reads first: each input read once and handed on."""

from __future__ import annotations


def test_a_sweep_reads_its_saved_rollouts_once(cli, tiny_dirs, tmp_path, monkeypatch):
    """`sweep --rollouts DIR --method fisher` where DIR is an exact sweep of the same rollouts: the input check, the
    memory check, the sweep and the agreement with the exact sweep all use the one copy check_inputs read (they
    read it 3-4 times before), and the table is the same as when each read its own."""
    import fp8probe.model.rollouts as rollouts_module

    exact = tmp_path / "exact"
    assert (
        cli(
            "-q",
            "sweep",
            tiny_dirs["llama"],
            "--out",
            exact,
            "--method",
            "exact",
            "--num-prompts",
            3,
            "--max-new-tokens",
            6,
        ).code
        == 0
    )
    calls = []
    real = rollouts_module.load_rollouts
    monkeypatch.setattr(rollouts_module, "load_rollouts", lambda d: calls.append(str(d)) or real(d))
    r = cli("-q", "sweep", tiny_dirs["llama"], "--out", tmp_path / "fast", "--rollouts", exact, "--method", "fisher")
    assert r.code == 0, r.err
    assert calls == [str(exact)], calls
    assert (tmp_path / "fast" / "agreement.json").exists()  # compared with the exact sweep, on the same tokens
