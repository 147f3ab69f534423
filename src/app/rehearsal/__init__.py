"""Rehearse a GPU recipe on CPU (``python -m app rehearse --config configs/vlm/X.yaml``): the recipe as written but for
what a CPU cannot have (:mod:`app.rehearsal.recipe`), fitted, resumed, exported and compared with its float32 variant
(:mod:`app.rehearsal.run`)."""

from app.rehearsal.recipe import Change, RehearsalPlan, float32_variant, gpu_recipes, plan_rehearsal
from app.rehearsal.run import Verdict, rehearse

__all__ = ["Change", "RehearsalPlan", "Verdict", "float32_variant", "gpu_recipes", "plan_rehearsal", "rehearse"]
