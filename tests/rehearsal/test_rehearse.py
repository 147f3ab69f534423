"""Every GPU recipe rehearses on CPU (``python -m app rehearse --all configs``, one launch of two gloo processes for all
of them): float32 master weights wherever compute is bf16, the same share of trainable elements changed as the float32
variant (within a point), finite losses, a checkpoint that saves, resumes and exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.rehearsal import gpu_recipes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the one launch: 92 s on 2 idle cores
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = [p.stem for p in gpu_recipes(CONFIGS)]


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory, app_env) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("rehearsal")
    command = [sys.executable, "-m", "app", "rehearse", "--all", str(CONFIGS), "--out", str(out)]
    result = subprocess.run(command, env=app_env(), capture_output=True, text=True, timeout=1400)
    summary = out / "rehearsal.json"
    assert summary.exists(), f"no summary; exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    verdicts = {v["recipe"]: v for v in json.loads(summary.read_text())["verdicts"]}
    verdicts["_output"] = {"text": result.stdout + result.stderr, "returncode": result.returncode}
    return verdicts


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_recipe_rehearses(rehearsals, recipe):
    verdict = rehearsals[recipe]
    failed = [name for name, ok in verdict["checks"].items() if not ok]
    assert not failed, f"{recipe}: {failed}; {verdict['details']}"
    assert verdict["details"]["trainable"] == "float32" and verdict["details"]["optimizer_state"] == "float32"


def test_the_command_prints_every_change_and_the_verdicts(rehearsals):
    output = rehearsals["_output"]
    assert output["returncode"] == 0
    stdout = output["text"]
    assert stdout.count("everything else as written") == len(RECIPES)
    assert "use_liger_kernel" in stdout and "the embedded tiny model of the same family" in stdout
    assert stdout.count("all passed") == len(RECIPES)
    assert "precision: trainable weights float32" in stdout  # the line every fit prints at its start
