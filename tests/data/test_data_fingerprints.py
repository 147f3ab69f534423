"""The data every recipe trains and evaluates on is pinned: fingerprints of what each config's data module yields.

The fingerprints were computed with the code from before the task generators moved to ``app.tasks`` and the data
module took its data set as ``class_path`` / ``init_args`` (when configs named a task string and ``task_kwargs``), so
these tests prove the move changed no sample: the same prompts, answers, reasoning, meta and image pixels, the same
per-split seeds (``split_seed``) and the same training order. That keeps the quickstart's before / after accuracy
comparable across the change.

A fingerprint hashes the first training batch (through ``train_dataloader``: the sampler's order included) and the
first two validation and test samples. Rendering goes through Pillow, NumPy and OpenCV, so upgrading one of them (the
versions are pinned in requirements/) may change pixels legitimately; recompute the table then, with
``fingerprints(...)`` below, after checking that the change comes from the upgrade.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning import LightningDataModule

from app.data import VisualTaskDataModule
from app.tasks.core import CoreTripletDataset
from app.tasks.dots import PairedDotsDataset
from app.tasks.reason_rft import SpatialTransformationDataset, StructurePerceptionDataset, VisualCountingDataset
from app.tasks.spatial import SpatialVQADataset
from app.tasks.vbvr import VBVRPromptDataset

ROOT = Path(__file__).resolve().parents[2]

CONFIG_FINGERPRINTS = {
    "configs/quickstart/consistency_dots.yaml": ("ae8ad7b3702f22e6", "5320c0c4519dc71d", "405964605de807f9"),
    "configs/flow/dance_grpo_sd3_5_medium.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_grpo_sd3_5_medium.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_grpo_sd3_5_medium_clip_vbvr.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_grpo_sd3_5_medium_ocr.yaml": ("9d56221298b894f4", "daae4702b9b4b86d", "c1213ad6b94cfff4"),
    "configs/flow/flow_grpo_wan2_1_i2v_14b.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_grpo_wan2_1_t2v_1_3b.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_grpo_wan2_2_ti2v_5b.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/flow/flow_nft_sd3_5_medium.yaml": ("a3491935a70d4ae7", "905b80b6e4f6653c", "dec2554b887a8770"),
    "configs/quickstart/quickstart.yaml": ("96dda23eb0aa661f", "ab22a3d9fae8c114", "29cbec44f35c0172"),
    "configs/quickstart/quickstart_flow.yaml": ("f4f8f909e377c142", "379f6a67b9f47a0c", "f5f5c58de5dc851f"),
    "configs/quickstart/quickstart_flow_nft.yaml": ("f4f8f909e377c142", "379f6a67b9f47a0c", "f5f5c58de5dc851f"),
    "configs/quickstart/quickstart_flow_pretrain.yaml": ("6ff76a252511f58f", "c82736df8150f65d", "c3fd52f42e77a7f1"),
    "configs/quickstart/quickstart_sft.yaml": ("a4a1184ff08a981e", "ab22a3d9fae8c114", "29cbec44f35c0172"),
    "configs/quickstart/quickstart_vbvr.yaml": ("c5998104666a4839", "06a302f58967da93", "e20d472debfda762"),
    "configs/quickstart/quickstart_vbvr_nft.yaml": ("c5998104666a4839", "06a302f58967da93", "e20d472debfda762"),
    "configs/quickstart/quickstart_vbvr_pretrain.yaml": ("3fa428131048d768", "06a302f58967da93", "e20d472debfda762"),
    "configs/repro/reason_rft_count_grpo.yaml": ("94808dac33fc3a15", "68af59eb868669f0", "2577a9a27877f060"),
    "configs/repro/reason_rft_count_sft.yaml": ("8042d4e2da3f83d3", "68af59eb868669f0", "2577a9a27877f060"),
    "configs/quickstart/reason_rft_counting.yaml": ("94808dac33fc3a15", "137b6d276e74151c", "99b76f2453bbbd39"),
    "configs/repro/reason_rft_leftof_grpo.yaml": ("96dda23eb0aa661f", "f6393d38c0f1a137", "03758e800a5ee962"),
    "configs/repro/reason_rft_leftof_sft.yaml": ("a4a1184ff08a981e", "f6393d38c0f1a137", "03758e800a5ee962"),
    "configs/repro/reason_rft_skill_generalist.yaml": ("d620d8c0a79a0c19", "ad5a80cb6920e2c5", "07871493ea4e8ed9"),
    "configs/repro/reason_rft_skill_grpo.yaml": ("2aa03e599adde7cc", "6d4bf6973c823eb6", "bf130b4916182792"),
    "configs/repro/reason_rft_skill_sft.yaml": ("6afbba856e1a771b", "6d4bf6973c823eb6", "bf130b4916182792"),
    "configs/quickstart/reason_rft_transform.yaml": ("6b967b29f58aa98b", "b517552bff3b767b", "127158ca6c60d9c3"),
    "configs/quickstart/trisr_dots.yaml": ("624ac8a6e25ff223", "079f05ae662d577c", "6cbea93a6aa26d8f"),
    "configs/repro/trisr_dots_grpo.yaml": ("ef2e12d40265995c", "4e10778095fce635", "3d5f9fd317b389d2"),
    "configs/repro/trisr_dots_sft.yaml": ("905c2092cec775a9", "4e10778095fce635", "3d5f9fd317b389d2"),
    "configs/quickstart/vbvr_pipeline_cpu.yaml": ("c5998104666a4839", "06a302f58967da93", "e20d472debfda762"),
    "configs/quickstart/motion_direction.yaml": ("d1a1863127c9d3b0", "3cfa2578451b6699", "f2a00e12d23098c6"),
    "configs/quickstart/motion_direction_sft.yaml": ("d8ffa211f94d6ccc", "3cfa2578451b6699", "f2a00e12d23098c6"),
    "configs/quickstart/quickstart_flow_guard.yaml": ("f4f8f909e377c142", "379f6a67b9f47a0c", "f5f5c58de5dc851f"),
    "configs/quickstart/text_render_flow.yaml": ("ec4870ac97e799ce", "90c3923dcb0a6d35", "ba0f01746e905f96"),
    "configs/quickstart/text_render_pretrain.yaml": ("a507fb8693ce9332", "36f2cc8ea487494d", "059336ca8236c032"),
    "configs/vlm/video_grpo_qwen2_5_vl_3b.yaml": ("e1c6d8ace3a05b12", "6094b10e45e37abe", "8fcdd4e50c640e3b"),
    "tests/fixtures/tiny_grpo.yaml": ("fb56df4e51aa5439", "ab22a3d9fae8c114", "29cbec44f35c0172"),
    "tests/fixtures/tiny_sft.yaml": ("fb56df4e51aa5439", "ab22a3d9fae8c114", "29cbec44f35c0172"),
}
"""Config -> (first training batch, first two validation samples, first two test samples)."""

# The data sets no recipe uses, small: (data set factory, image size) -> fingerprints. Each was the task string of the
# old registry in brackets, built with train_size=6, val_size=2, test_size=2, batch_size=2, seed=3.
DATASET_FINGERPRINTS = {
    "spatial_vqa": (
        (SpatialVQADataset, 96),
        ("c1f555476ad7b55f", "5eca5cd9482cd370", "85c5f938e2a07713"),
    ),
    "core_triplets": (
        (CoreTripletDataset, 64),
        ("16c229c807bb849d", "1aa63f7cb73a456d", "3dfd189b2e7bc878"),
    ),
    "rrft_structure": (
        (StructurePerceptionDataset, 64),
        ("582769a09e0383ea", "234d78915046ab5d", "a45d8fd5a225fb60"),
    ),
    "rrft_counting": (
        (functools.partial(VisualCountingDataset, split="cot_sft"), 64),
        ("ef2c5e14dafb5308", "da6a64763a6fe0a5", "a452228188bc683e"),
    ),
    "rrft_transformation": (
        (SpatialTransformationDataset, 64),
        ("76d04b76b5f21b7f", "1d34a02c953c1ddc", "1dbbf482e6c3955d"),
    ),
    "vbvr_prompts": (
        (functools.partial(VBVRPromptDataset, tasks=["object_counting", "maze_path"]), 96),
        ("277a8e17a31a02e2", "0d078ca019d7ffc5", "c89e47bec6bd20aa"),
    ),
    "dots_left_of_pairs": (
        (functools.partial(PairedDotsDataset, labeled=False), 64),
        ("637c02320df37582", "ed2ebed65af71dbe", "b673b137f0780d01"),
    ),
}


def fingerprint(items) -> str:
    """Hash of samples (pairs flattened): task, question, answer, reasoning, meta, and each image's mode, size,
    pixels."""
    digest = hashlib.sha256()
    for item in items:
        for s in item if isinstance(item, (tuple, list)) else (item,):
            digest.update(repr((s.task, s.question, s.answer, s.reasoning)).encode())
            digest.update(json.dumps(s.meta, sort_keys=True, default=repr).encode())
            for image in s.images:
                digest.update(repr((image.mode, image.size)).encode())
                digest.update(image.tobytes())
    return digest.hexdigest()[:16]


def fingerprints(data: VisualTaskDataModule) -> tuple[str, str, str]:
    data.num_workers = 0  # same samples, no worker processes
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    val = [data.val_dataset[i] for i in range(min(2, len(data.val_dataset)))]
    test = [data.test_dataset[i] for i in range(min(2, len(data.test_dataset)))]
    return fingerprint(batch), fingerprint(val), fingerprint(test)


def data_module_of(path: Path) -> LightningDataModule:
    """The ``data`` section of a config, parsed and instantiated as LightningCLI does (the model is left alone)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    config = parser.parse_object({"data": yaml.safe_load(path.read_text())["data"]})
    return parser.instantiate(config).data


def test_every_config_with_a_visual_task_data_module_is_pinned():
    configs = sorted((ROOT / "configs").rglob("*.yaml")) + sorted((ROOT / "tests" / "fixtures").glob("*.yaml"))
    generated = {
        str(path.relative_to(ROOT))
        for path in configs
        if (data := (yaml.safe_load(path.read_text()) or {}).get("data", {})).get("class_path")
        == "app.data.VisualTaskDataModule"
        # data read from the user's files (app.data.files) is theirs, not generated: nothing to pin
        and not data["init_args"]["dataset"]["class_path"].startswith("app.data.files.")
    }
    assert generated == set(CONFIG_FINGERPRINTS)


@pytest.mark.parametrize("config", sorted(CONFIG_FINGERPRINTS), ids=lambda c: Path(c).name)
def test_config_yields_the_pinned_data(config):
    data = data_module_of(ROOT / config)
    assert isinstance(data, VisualTaskDataModule)
    assert fingerprints(data) == CONFIG_FINGERPRINTS[config]


@pytest.mark.parametrize("name", sorted(DATASET_FINGERPRINTS))
def test_data_set_yields_the_pinned_data(name):
    (factory, image_size), expected = DATASET_FINGERPRINTS[name]
    data = VisualTaskDataModule(
        factory, train_size=6, val_size=2, test_size=2, batch_size=2, seed=3, image_size=image_size
    )
    assert fingerprints(data) == expected
