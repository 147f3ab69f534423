"""Shared fixtures: one embedded-model cache for the whole session (subprocesses included), tiny policies, dots samples.

Environment set at import time, before anything imports transformers, so that every test and every subprocess it
starts sees it:

- ``APP_CACHE_DIR``: a per-session folder (unless already set), so tiny models are built once and shared.
- ``HF_HUB_OFFLINE``: nothing may download; a wrong name fails at once instead of retrying the hub for a minute.
- ``OMP_NUM_THREADS`` / ``torch.set_num_threads``: one thread by default (``APP_TEST_THREADS`` overrides). The models
  are tiny, so more threads gain nothing, and on a shared 2-core machine two spinning OpenMP threads per process make
  every matmul over 100x slower.

Random inputs: before every test, python ``random``, numpy and torch are seeded with the test's own seed, derived from
its node id and ``APP_TEST_SEED`` (default 0), so an unseeded draw is still reproducible; a failing test's report shows
the seed (section "random seed"). Tests that draw their own inputs take it from the ``random_seed`` fixture; run with
another ``APP_TEST_SEED`` for fresh inputs.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
THREADS = int(os.environ.get("APP_TEST_THREADS", "1"))
BASE_SEED = int(os.environ.get("APP_TEST_SEED", "0"))

if "APP_CACHE_DIR" not in os.environ:
    os.environ["APP_CACHE_DIR"] = tempfile.mkdtemp(prefix="app-test-cache-")
    atexit.register(shutil.rmtree, os.environ["APP_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for path in (str(ROOT / "src"), str(ROOT)):  # `app` and the top-level `callbacks` package, also without PYTHONPATH
    if path not in sys.path:
        sys.path.insert(0, path)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)


# ------------------------------------------------------------------------------------------------- random seeds
def seed_for(nodeid: str, base: int = BASE_SEED) -> int:
    """The seed of the test ``nodeid``: fixed for a given ``APP_TEST_SEED``, whatever runs before it or where."""
    return zlib.crc32(f"{base}:{nodeid}".encode())  # in [0, 2**32), what numpy accepts


@pytest.fixture(autouse=True)
def random_seed(request) -> int:
    """Seeds python ``random``, numpy and torch with this test's seed (see the module docstring) and returns it."""
    seed = seed_for(request.node.nodeid)
    request.node.user_properties.append(("random_seed", seed))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


# ------------------------------------------------------------------------------------------------------ test ids
def plain_id(value: str | bytes, limit: int = 40) -> str:
    """A test id that can be named again on the command line: printable ASCII without backslashes, at most ``limit``
    characters. pytest escapes other characters into ids that no command line selects (``pytest 'x[\\frac]'`` is
    "not found"), which would break every rerun by id: mutmut's per-mutant runs, ``--lf``, a CI log's failing id."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = "".join(
        c if c.isascii() and c.isprintable() and c != "\\" else "/" if c == "\\" else " " if c.isspace() else "?"
        for c in value[: limit + 1]  # no more is shown; some parameters are 100,000-character completions
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pytest_make_parametrize_id(config, val, argname):
    """Strings and bytes parameters get :func:`plain_id` ids; other values keep pytest's own."""
    return plain_id(val) if isinstance(val, (str, bytes)) else None


def _check_selectable_ids(items) -> None:
    unselectable = [item.nodeid for item in items if item.nodeid != plain_id(item.nodeid, limit=len(item.nodeid))]
    if unselectable:
        raise pytest.UsageError(
            f"{len(unselectable)} test id(s) cannot be selected by id on a command line (non-printable or non-ASCII "
            f"characters, or a backslash), e.g. {unselectable[0]!r}: give the parameters plain ids (conftest.plain_id)"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Add the test's seed to the report of a failure (and to ``user_properties``, which JUnit XML records)."""
    report = yield
    if report.failed:
        seed = dict(item.user_properties).get("random_seed", seed_for(item.nodeid))
        report.sections.append(
            ("random seed", f"random seed: {seed} (APP_TEST_SEED={BASE_SEED}; the same value reproduces this run)")
        )
    return report


def pytest_collection_modifyitems(config, items):
    """Every test id must be selectable by id (:func:`plain_id`). mutmut's sessions reorder and trim the collected
    tests in ``tools/mutant_run_plugin.py``, which only its runs load (``[tool.mutmut] pytest_add_cli_args``). Under
    pytest-xdist the files holding ``slow`` tests go first (:func:`slow_files_first`)."""
    _check_selectable_ids(items)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its collection is the order files are handed out in
        items[:] = slow_files_first(items)


def slow_files_first(items: list) -> list:
    """``items`` with the files that hold a ``slow`` test (end-to-end runs, process launches) before the others, each
    file's tests in their order. ``--dist loadfile`` hands whole files to the workers in this order, so the long files
    start at once and the short ones fill the gaps, instead of one long file starting last and running alone."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    return sorted(items, key=lambda item: item.nodeid.split("::")[0] not in slow)  # sorted() is stable


MAX_WORKERS = 4
"""Most pytest-xdist workers ``-n auto`` starts: each imports torch and transformers and some launch 2-4 ranks, so
more workers than this would trade little speed for a lot of memory."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which mutmut's runs switch off
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most :data:`MAX_WORKERS`."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
"""torch.distributed's rendezvous variables: an in-process fit on one process sets MASTER_PORT in this session, and a
subprocess that inherited it would meet that port still bound (EADDRINUSE) instead of choosing a free one."""


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for ``python -m app`` subprocesses: the session's cache, offline, src and the repo on the path, and
    none of this session's rendezvous variables (:data:`RENDEZVOUS`)."""
    env = {key: value for key, value in os.environ.items() if key not in RENDEZVOUS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def dots_samples(n: int, seed: int = 0):
    """``n`` labeled dots samples with 64-pixel images (the quickstart task, small)."""
    from app.tasks.dots import DotsDataset

    dataset = DotsDataset(n, seed, image_size=64, dot_radius=12)
    return [dataset[i] for i in range(n)]


def make_policy(model: str = "tiny-qwen2-vl", lora_r: int | None = 4, **kwargs):
    """A fresh tiny policy; LoRA (rank ``lora_r``, no dropout) unless ``lora_r`` is None (full fine-tuning)."""
    from app.models import VLMPolicy
    from app.settings import LoRASettings

    lora = LoRASettings(r=lora_r, alpha=2 * lora_r, dropout=0.0) if lora_r is not None else None
    return VLMPolicy(model, lora=lora, **kwargs)


@pytest.fixture(scope="session")
def tiny_policy():
    """A tiny-qwen2-vl policy with LoRA r=4 (dropout 0). Shared: tests must not change its weights."""
    return make_policy().eval()


@pytest.fixture(scope="session")
def samples():
    """Four dots samples (64 px, one image each)."""
    return dots_samples(4)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def new_policy():
    """Factory of fresh tiny policies (for tests that train or perturb weights): ``new_policy(model, lora_r, **kw)``."""
    return make_policy


@pytest.fixture(scope="session")
def new_samples():
    """Factory of dots samples: ``new_samples(n, seed)``."""
    return dots_samples


@pytest.fixture
def print_config(capsys):
    """``print_config(args) -> dict``: ``fit *args --print_config`` run in process (parse and validate, print, exit 0;
    nothing is instantiated), the printed config read back."""
    import yaml

    from app.command_line.commands import AppCLI

    def run(args: list[str]) -> dict:
        with pytest.raises(SystemExit) as exit_info:
            AppCLI(args=["fit", *args, "--print_config"])
        captured = capsys.readouterr()
        assert exit_info.value.code in (0, None), captured.err[-2000:]
        return yaml.safe_load(captured.out)

    return run


@pytest.fixture(scope="session")
def app_env():
    """Factory of subprocess environments: ``app_env(**extra)``."""
    return subprocess_env


class StepRecorder:
    """Keeps, after every training batch, the global step, the logged metrics (as floats) and the step's outputs."""

    def __init__(self):
        import lightning as L

        class _Callback(L.Callback):
            def on_train_batch_end(cb, trainer, pl_module, outputs, batch, batch_idx):
                metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
                self.steps.append({"global_step": trainer.global_step, "metrics": metrics, "outputs": outputs})

        self.steps: list[dict] = []
        self.callback = _Callback()

    def metric(self, key: str) -> list[float]:
        return [step["metrics"][key] for step in self.steps]


def run_fit(module, data, max_steps: int = 2, callbacks=(), ckpt_path=None, weights_only=None, **trainer_kwargs):
    """Fit ``module`` on CPU (no logger, no checkpoints, no progress bar) and record every step.

    ``data`` is a LightningDataModule or a training DataLoader. Returns ``(trainer, recorder)``.
    """
    import lightning as L

    recorder = StepRecorder()
    kwargs = dict(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    kwargs.update(trainer_kwargs)
    trainer = L.Trainer(callbacks=[recorder.callback, *callbacks], **kwargs)
    if isinstance(data, L.LightningDataModule):
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path, weights_only=weights_only)
    else:
        trainer.fit(module, train_dataloaders=data, ckpt_path=ckpt_path, weights_only=weights_only)
    return trainer, recorder


@pytest.fixture(scope="session")
def fit():
    """``fit(module, data, max_steps=2, callbacks=(), ckpt_path=None, weights_only=None, **trainer_kwargs)``
    -> ``(trainer, recorder)``."""
    return run_fit


def tiny_datamodule(train_size: int = 8, batch_size: int = 2, seed: int = 0, **kwargs):
    """The quickstart's data module, tiny: 64-pixel dots images."""
    import functools

    from app.data import VisualTaskDataModule
    from app.tasks.dots import DotsDataset

    args = dict(
        dataset=functools.partial(DotsDataset, dot_radius=12),
        train_size=train_size,
        val_size=4,
        test_size=4,
        batch_size=batch_size,
        val_batch_size=4,
        seed=seed,
        image_size=64,
    )
    return VisualTaskDataModule(**{**args, **kwargs})


@pytest.fixture(scope="session")
def new_datamodule():
    """Factory of tiny dots data modules: ``new_datamodule(train_size=8, batch_size=2, seed=0, **kwargs)``."""
    return tiny_datamodule


def snapshot(module) -> dict:
    """A copy of every parameter of ``module`` by name."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}


@pytest.fixture(scope="session")
def params_snapshot():
    """``params_snapshot(module) -> {name: tensor}`` (detached copies)."""
    return snapshot
