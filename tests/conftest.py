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
from collections.abc import Callable
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


# ------------------------------------------------------------------------------------------------- mutant runs
# mutmut runs each mutant's tests in a new pytest session, forked from a process that holds torch, the package and
# every test module, with the ids of the tests that reach the mutated function (up to ~1,000 of them) on the command
# line. The hooks below change nothing outside those sessions (mutmut's mutant names hold "__mutmut_").
_REQUESTED_IDS = pytest.StashKey[set]()


def _in_mutant_run() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


_MUTMUT_LOOKUP = pytest.StashKey[Callable[[], str]]()


def _fix_active_mutant(config) -> None:
    """mutmut wraps every mutated function in a trampoline that looks the active mutant up in ``os.environ`` on every
    call (so that a test that clears the environment cannot switch it off). Within one of its sessions the mutant never
    changes, and the look-ups cost up to 40 % of a test that calls a mutated parser in a loop (a numeric-reward mutant
    ran 2.0 s, 1.3 s without them; ``tools/mutmut_trampolines.py`` times one call). The lookup is fixed to
    the session's value until the session ends. Nothing here changes when mutmut's trampoline module is not loaded."""
    trampoline = sys.modules.get("mutmut.mutation.trampoline")
    if trampoline is None or not callable(getattr(trampoline, "get_mutant_under_test", None)):
        return
    active = os.environ["MUTANT_UNDER_TEST"]
    config.stash[_MUTMUT_LOOKUP] = trampoline.get_mutant_under_test
    trampoline.get_mutant_under_test = lambda: active


def pytest_unconfigure(config):
    lookup = config.stash.get(_MUTMUT_LOOKUP, None)
    if lookup is not None:  # the statistics run's session ends in mutmut's own process
        sys.modules["mutmut.mutation.trampoline"].get_mutant_under_test = lookup


def pytest_configure(config):
    """In a mutant run (and mutmut's statistics run): fix the active mutant for the session (:func:`_fix_active_mutant`).
    In a mutant run also: freeze the inherited heap out of the garbage collector (its full passes over it cost about a
    second of collection per mutant), reset what multiprocessing resets in a process it forks, stop property tests at
    their first failing example, and collect the named tests' files whole, keeping the named tests afterwards:
    pytest matches each id on the command line against its file separately, which cost more than collecting the
    files (measured with cProfile on a 760-test mutant run; ``tools/pytest_overhead.py`` times sessions)."""
    if _in_mutant_run() or os.environ.get("MUTANT_UNDER_TEST") == "stats":
        _fix_active_mutant(config)
    if not _in_mutant_run():
        return
    import gc

    from hypothesis import Phase
    from hypothesis import settings as hypothesis_settings

    gc.freeze()
    # mutmut forks with os.fork, which skips the hooks multiprocessing runs in the processes it forks itself. Among them
    # the reset of the resource sharer that passes tensors' file descriptors to pool workers and DataLoader workers:
    # without it a worker asks the parent's sharer thread (which this process does not have) and dies, and a test that
    # uses a process pool failed for every mutant (14 mutants counted as caught by that failure alone on 2026-12-02)
    from multiprocessing import util as multiprocessing_util

    multiprocessing_util._run_after_forkers()
    # a failing property test stops at its first failing example: shrinking it and explaining it (a traced rerun of every
    # line) show a person the smallest case, and mutmut reads only the exit code
    hypothesis_settings.register_profile("mutant-run", phases=(Phase.explicit, Phase.reuse, Phase.generate))
    hypothesis_settings.load_profile("mutant-run")
    if config.args and all("::" in arg for arg in config.args):
        config.stash[_REQUESTED_IDS] = set(config.args)
        config.args[:] = list(dict.fromkeys(arg.split("::")[0] for arg in config.args))


def _keep_requested(config, items) -> None:
    requested = config.stash.get(_REQUESTED_IDS, None)
    if requested is None:
        return
    missing = requested - {item.nodeid for item in items}
    if missing:
        raise pytest.UsageError(f"{len(missing)} requested test id(s) not found, e.g. {sorted(missing)[0]!r}")
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in requested])
    items[:] = [item for item in items if item.nodeid in requested]


def pytest_collection_modifyitems(config, items):
    """In a mutant run (see above), run the test files with the least recorded time first, and in each file its
    quickest tests first: the run stops at the first failure, so a caught mutant is caught sooner. Files stay whole,
    so module fixtures are built once. First, every test id must be selectable by id (also outside mutant runs)."""
    _check_selectable_ids(items)
    if os.environ.get("MUTANT_UNDER_TEST") == "" and os.environ.get(_STATS_PASSED) and items:
        config.hook.pytest_deselected(items=items[1:])  # mutmut's clean run after a passing full statistics run
        del items[1:]
    if not _in_mutant_run():
        return
    _keep_requested(config, items)
    durations = _recorded_test_durations()
    cost: dict[str, float] = {}
    for item in items:
        cost[item.fspath.strpath] = cost.get(item.fspath.strpath, 0.0) + durations.get(item.nodeid, 1.0)
    items.sort(key=lambda item: (cost[item.fspath.strpath], durations.get(item.nodeid, 1.0)))


# mutmut records only each test's call phase; fixtures that fit a model would make their file look free. Its statistics
# run (MUTANT_UNDER_TEST=stats) therefore also writes setup + call + teardown per test here, in its working directory.
FULL_DURATIONS = Path("mutmut-full-durations.json")
_full_durations: dict[str, float] = {}


# Which test caught each mutant: a line per caught mutant, in a file per mutated function under KILLS in mutmut's working
# directory (``tools/mutation_summary.py --killers`` reads them).
KILLS = Path("mutmut-kills")
_kill_recorded = False


def pytest_runtest_logreport(report):
    global _kill_recorded
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        _full_durations[report.nodeid] = _full_durations.get(report.nodeid, 0.0) + report.duration
    elif report.failed and not _kill_recorded and _in_mutant_run():
        _kill_recorded = True
        function, _, number = os.environ["MUTANT_UNDER_TEST"].rpartition("__mutmut_")
        KILLS.mkdir(exist_ok=True)
        with open(KILLS / function, "a", encoding="utf-8") as kills:
            kills.write(f"{number} {report.nodeid}\n")


# mutmut then runs the same tests once more, unmutated ("clean", MUTANT_UNDER_TEST=""), in the same process, to check
# that they pass before it mutates anything. After a statistics run over the whole selection that passed, that run is
# the check (the trampolines call the original code in both), so the clean run keeps one test: ~100 s less per run.
# An incremental run, whose statistics cover only new tests or come from the cache, runs its clean run in full.
_STATS_PASSED = "APP_MUTMUT_FULL_STATS_PASSED"


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    whole_selection = not any("::" in arg for arg in session.config.args)
    if whole_selection and exitstatus == 0 and session.testsfailed == 0:
        os.environ[_STATS_PASSED] = "1"
    if _full_durations:
        import json

        known = json.loads(FULL_DURATIONS.read_text()) if FULL_DURATIONS.is_file() else {}
        FULL_DURATIONS.write_text(json.dumps({**known, **_full_durations}))
        _full_durations.clear()


def _recorded_test_durations() -> dict[str, float]:
    """Each test's recorded time: setup + call + teardown from mutmut's statistics run if written (see
    ``FULL_DURATIONS``), else mutmut's own call times (its in-memory state in this forked process), else nothing."""
    import json

    if FULL_DURATIONS.is_file():
        return json.loads(FULL_DURATIONS.read_text())
    mutmut_state = sys.modules.get("mutmut.state")
    if mutmut_state is not None and mutmut_state.state().duration_by_test:
        return mutmut_state.state().duration_by_test
    return {}


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for ``python -m app`` subprocesses: the session's cache, offline, src and the repo on the path."""
    env = dict(os.environ)
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
    from app.models import LoRASettings, VLMPolicy

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
