"""Writing the VBVR-Pro task suite (:mod:`app.tasks.vbvr`) to WebDataset shards, and reading it back.

One sample per task instance: ``prompt.txt`` (what the generator model receives), ``json`` (task, seed, split, config,
solution, key-frame indices, metadata), ``first.png`` (the problem), ``last.png`` (Last-Frame regime),
``keyframes.npy`` (Key-Frame regime, ``[K, H, W, 3]`` uint8) and ``video.npy`` (Multi-Frame regime / video,
``[T, H, W, 3]`` uint8).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from app.data.shards import read_records
from app.tasks.vbvr.core import TaskInstance
from app.tasks.vbvr.registry import TASKS, get_task

SPLITS = ("in_domain", "out_of_domain")


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode(instance: TaskInstance, split: str, params: dict) -> dict[str, object]:
    record = {
        "task": instance.task,
        "seed": instance.seed,
        "split": split,
        "params": params,
        "config": instance.config,
        "solution": instance.solution,
        "key_frame_indices": instance.key_frame_indices,
        "metadata": instance.metadata,
    }
    return {
        "__key__": f"{instance.task}-{split}-{instance.seed:08d}",
        "prompt.txt": instance.prompt,
        "json": json.dumps(record).encode(),
        "first.png": _png(instance.first_frame),
        "last.png": _png(instance.last_frame),
        "keyframes.npy": _npy(instance.key_frames),
        "video.npy": _npy(instance.frames),
    }


def task_params(name: str, split: str, image_size: int) -> dict:
    """Parameters of ``name`` for a split: defaults in-domain, the task's harder settings out-of-domain."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    task = get_task(name, image_size=image_size)
    params = {"image_size": image_size, **task.params}
    return {**params, **task.out_of_domain_params()} if split == "out_of_domain" else params


def write_shards(
    out_dir: str | Path,
    num_per_task: int,
    seed: int = 0,
    split: str = "in_domain",
    tasks: Sequence[str] | None = None,
    image_size: int = 128,
    max_per_shard: int = 256,
    progress: bool = False,
) -> list[Path]:
    """Write ``num_per_task`` instances of each task (all registered ones by default); deterministic for ``seed``."""
    names = sorted(tasks or TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; known: {sorted(TASKS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pattern = str(out_dir / f"vbvr-{split}-%06d.tar")
    jobs = [(name, seed * 1_000_003 + i) for name in names for i in range(num_per_task)]
    if progress:
        from tqdm import tqdm

        jobs = tqdm(jobs, desc=f"vbvr {split}", unit="sample")
    written = []
    with wds.ShardWriter(pattern, maxcount=max_per_shard, verbose=0) as sink:
        for name, instance_seed in jobs:
            params = task_params(name, split, image_size)
            instance = get_task(name, **params).generate(instance_seed)
            sink.write(encode(instance, split, params))
        written = sorted(out_dir.glob(f"vbvr-{split}-*.tar"))
    return written


def read_shards(urls: str | Sequence[str]) -> Iterator[dict]:
    """Decoded samples: ``prompt`` str, ``record`` dict, ``first``/``last`` uint8 images, ``keyframes``/``video``
    arrays.

    A damaged shard raises :class:`~app.data.shards.ShardDamageError` naming the file and what was lost (a plain tar
    reader would stop at a corrupt header as if the shard had ended).
    """
    decode = wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")])
    for record in read_records(list(urls) if not isinstance(urls, str) else urls):
        sample = decode(record)
        yield {
            "key": sample["__key__"],
            "prompt": sample["prompt.txt"],
            "record": sample["json"],
            "first": sample["first.png"],
            "last": sample["last.png"],
            "keyframes": sample["keyframes.npy"],
            "video": sample["video.npy"],
        }
