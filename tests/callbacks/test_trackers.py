"""The logging callbacks through the real experiment trackers, offline: a short fit of the stand-in GRPO module with
Lightning's ``WandbLogger`` (offline mode) or ``MLFlowLogger`` (a sqlite store in the test's folder), then what the
library wrote is read back (the W&B run's transaction log and media files; the MLflow store through its client).

Each tracker's tests are skipped when its extra (``wandb``, ``mlflow``) is not installed; the dev lock has both.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import psutil
import pytest
from PIL import Image

from callbacks.completion_table import BASE_COLUMNS, CompletionTableLogger
from callbacks.reward_breakdown import RewardBreakdownLogger
from callbacks.sample_grid import SampleGridLogger
from callbacks.throughput import ThroughputLogger

FRAMES, CELL, STEPS = 3, 32, 2
# the stand-in's train/kl at its training steps 0 and 1: Lightning logs a step's self.log values at that step, the
# callbacks log at trainer.global_step, which the optimizer step has already advanced (1 and 2)
KL = {0: 0.5, 1: 0.25}
GRID_SIZE = (3 * CELL + 4 * 2, CELL + 16 + 2 * 2)  # one prompt: its text and K = 2 samples, 2-pixel padding
TABLE_COLUMNS = ["image", *BASE_COLUMNS, "reward/accuracy"]
ROWS = 4  # max_rows: the 4 records of a step (2 prompts x K = 2)


def thumbnail_colours(step: int) -> list[tuple[int, int, int]]:
    """The prompt colour of each table row at the module's ``step``: batch ``step`` holds prompts ``2 step`` and
    ``2 step + 1`` (drawn as ``(40 i, 200, 30)``), row ``r`` is prompt ``r // K`` of the batch."""
    return [(40 * (2 * step + r // 2), 200, 30) for r in range(ROWS)]


def callbacks() -> list:
    return [
        SampleGridLogger(every_n_steps=1, max_prompts=1, cell_size=CELL),
        CompletionTableLogger(every_n_steps=1, max_rows=ROWS, thumbnail_size=16),
        RewardBreakdownLogger(every_n_steps=1, histogram_every_n_steps=1),
        ThroughputLogger(window_size=2),
    ]


def fit(tmp_path, stand_in, make_trainer, logger) -> None:
    module = stand_in(metrics={step: {"train/kl": kl} for step, kl in KL.items()}, frames=FRAMES)
    make_trainer(tmp_path, callbacks(), max_steps=STEPS, logger=logger).fit(module)


def wandb_children() -> list[psutil.Process]:
    """This process's descendants that run W&B (its ``wandb-core`` service)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "wandb" in " ".join(child.cmdline()).lower():
                found.append(child)
        except psutil.Error:  # exited meanwhile
            continue
    return found


# ---------------------------------------------------------------------------------------------------- Weights & Biases


@pytest.fixture
def wandb_logger(tmp_path, monkeypatch):
    """Lightning's WandbLogger in offline mode, everything under ``tmp_path``; torn down with its service process."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[wandb]')")
    from lightning.pytorch.loggers import WandbLogger

    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
    }
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[name] = str(tmp_path / "wandb-home")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = wandb.Settings(
        mode="offline",
        console="off",
        silent=True,
        disable_git=True,
        save_code=False,
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        x_save_requirements=False,
    )
    logger = WandbLogger(project="trackers", save_dir=str(tmp_path), offline=True, settings=settings)
    try:
        yield logger
    finally:
        close_wandb()
        assert not wandb_children(), "wandb left a process behind"


def close_wandb() -> None:
    """Finish the run and stop the wandb-core service process, waiting for it to exit: ``finish`` alone can return
    before the service has written the transaction log's last record (a test that read it then saw a record cut
    short: ``DecodeError``). Safe to call twice."""
    import wandb

    wandb.finish()
    wandb.teardown()
    psutil.wait_procs(wandb_children(), timeout=10)


def wandb_records(path: Path):
    """The protobuf records of a run's ``.wandb`` transaction log: a 7-byte header (``:W&B``, magic, version), then
    LevelDB-log chunks (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's logged rows, in order: ``key -> value``, a media value as its dict (``_type``, ``path``, ...)."""
    (log,) = run_dir.glob("run-*.wandb")
    rows = []
    for record in wandb_records(log):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            keys = list(item.nested_key) or [item.key]
            target = row
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            target[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def by_step(rows: list[dict[str, Any]], key: str) -> dict[int, Any]:
    """``trainer/global_step -> value`` of ``key`` (Lightning's WandbLogger logs the step as that metric)."""
    return {int(row["trainer/global_step"]): row[key] for row in rows if key in row}


def wandb_tables(run_dir: Path) -> list[tuple[dict[str, Any], dict[str, Path]]]:
    """Each logged table, in order: its JSON and its files (``media/images/...`` -> the staged file), from the run's
    table artifacts (the run's own ``media/table/*.table.json`` holds only the placeholder ``"Image"`` for an image)."""
    (log,) = run_dir.glob("run-*.wandb")
    tables = []
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "artifact" and record.artifact.type == "run_table":
            files = {entry.path: Path(entry.local_path) for entry in record.artifact.manifest.contents}
            (name,) = [path for path in files if path.endswith(".table.json")]
            tables.append((json.loads(files[name].read_text()), files))
    return tables


@pytest.mark.slow
def test_wandb_offline_run_holds_scalars_images_videos_tables_and_histograms(
    tmp_path, stand_in, make_trainer, wandb_logger
):
    fit(tmp_path, stand_in, make_trainer, wandb_logger)
    files = Path(wandb_logger.experiment.dir)  # <run>/files
    close_wandb()  # the service has written the whole transaction log once it has exited
    rows = wandb_history(files.parent)

    assert by_step(rows, "train/kl") == KL  # the module's self.log, at its own step
    assert by_step(rows, "train/time/rollout") == {1: 0.01, 2: 0.01}  # ThroughputLogger, from outputs["timings"]
    assert by_step(rows, "train/breakdown/accuracy/mean") == {1: 0.5, 2: 0.5}  # RewardBreakdownLogger
    histograms = by_step(rows, "train/reward_hist/accuracy")
    assert sorted(histograms) == [1, 2] and all(h["_type"] == "histogram" for h in histograms.values())
    assert [sum(h["values"]) for h in histograms.values()] == [ROWS, ROWS]  # N = 2 prompts x K = 2 rewards

    grids = by_step(rows, "samples/grid")
    assert sorted(grids) == [1, 2]
    for grid in grids.values():
        with Image.open(files / grid["filenames"][0]) as png:
            assert (png.format, png.size) == ("PNG", GRID_SIZE)
    videos = by_step(rows, "samples/video")
    assert sorted(videos) == [1, 2]
    for video in videos.values():
        with Image.open(files / video["videos"][0]["path"]) as gif:
            assert (gif.format, gif.n_frames, gif.size) == ("GIF", FRAMES, GRID_SIZE)  # the whole clip

    assert sorted(by_step(rows, "completions")) == [1, 2]
    tables = wandb_tables(files.parent)
    assert len(tables) == STEPS
    for step, (table, table_files) in enumerate(tables):
        assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == ROWS
        assert [row[TABLE_COLUMNS.index("step")] for row in table["data"]] == [step] * ROWS
        thumbnails = [row[0] for row in table["data"]]
        assert {cell["_type"] for cell in thumbnails} == {"image-file"}
        for cell, colour in zip(thumbnails, thumbnail_colours(step), strict=True):
            with Image.open(table_files[cell["path"]]) as thumb:
                assert thumb.size == (16, 16) and thumb.convert("RGB").getpixel((8, 8)) == colour


# -------------------------------------------------------------------------------------------------------------- MLflow


@pytest.fixture
def mlflow_logger(tmp_path, monkeypatch):
    """Lightning's MLFlowLogger on a sqlite store and an artifact folder in ``tmp_path``, telemetry off."""
    for module in ("mlflow", "pandas", "sqlalchemy", "alembic"):
        pytest.importorskip(module, reason=f"the mlflow extra is not installed ({module}; pip install -e '.[mlflow]')")
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    return MLFlowLogger(
        experiment_name="trackers",
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        artifact_location=str(tmp_path / "artifacts"),
    )


@pytest.mark.slow
def test_mlflow_run_holds_scalars_images_videos_and_tables(tmp_path, stand_in, make_trainer, mlflow_logger):
    from mlflow.tracking import MlflowClient

    fit(tmp_path, stand_in, make_trainer, mlflow_logger)
    client, run_id = MlflowClient(mlflow_logger._tracking_uri), mlflow_logger.run_id
    assert client.get_run(run_id).info.status == "FINISHED"  # the trainer's finalize

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    def artifacts(folder: str) -> list[str]:
        return sorted(a.path for a in client.list_artifacts(run_id, folder) if not a.is_dir)

    def download(path: str) -> Path:
        return Path(client.download_artifacts(run_id, path, str(tmp_path / "downloads")))

    assert history("train/kl") == KL
    assert history("train/time/rollout") == {1: 0.01, 2: 0.01}
    assert history("train/breakdown/accuracy/mean") == {1: 0.5, 2: 0.5}

    assert artifacts("samples/grid") == ["samples/grid/step_000001.png", "samples/grid/step_000002.png"]
    for path in artifacts("samples/grid"):
        with Image.open(download(path)) as png:
            assert (png.format, png.size) == ("PNG", GRID_SIZE)
    assert artifacts("samples/video") == ["samples/video/step_000001.gif", "samples/video/step_000002.gif"]
    for path in artifacts("samples/video"):
        with Image.open(download(path)) as gif:
            assert (gif.format, gif.n_frames, gif.size) == ("GIF", FRAMES, GRID_SIZE)

    assert artifacts("completions") == ["completions/step_000001.json", "completions/step_000002.json"]
    for step, path in enumerate(artifacts("completions")):
        table = json.loads(download(path).read_text())  # pandas' "split" layout
        assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == ROWS
        assert [row[TABLE_COLUMNS.index("step")] for row in table["data"]] == [step] * ROWS
        for j, (row, colour) in enumerate(zip(table["data"], thumbnail_colours(step), strict=True)):
            assert row[0] == f"step_{step + 1:06d}_{j:03d}.png"
            with Image.open(download(f"completions/images/{row[0]}")) as thumb:
                assert thumb.size == (16, 16) and thumb.convert("RGB").getpixel((8, 8)) == colour
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": "completions/step_000001.json", "type": "table"} in logged  # shown as a table by the UI
