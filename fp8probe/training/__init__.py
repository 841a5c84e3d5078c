"""Calibration: short training runs (OPD and GRPO, TRL underneath) at known rollout mismatch, the doses of their
levels on `check`'s scale, and the experiment that adds runs where they narrow the budget most."""
