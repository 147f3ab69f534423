"""TRL's GRPOTrainer at the geometry of ``benchmarks/grpo_step.py``: the reference for the GRPO-step target.

    pip install trl==1.16.0 datasets            # not a dependency of this package
    python benchmarks/trl_grpo_step.py          # full and LoRA
    python benchmarks/grpo_step.py              # ours, same geometry; compare the medians

Same model (the embedded tiny-qwen2.5-vl folder, random weights), same prompts (the dots task at 64 px with the
reasoning instruction), 4 prompts x K = 8 completions x up to 32 new tokens at temperature 1, float32 on the CPU, the
same accuracy + 0.5 x format rewards (this package's reward classes called from TRL's reward functions), one update per
rollout, no KL, learning rate 1e-5 (LoRA r 8 / alpha 16 on the same projections in LoRA mode). A step is one
``Trainer`` step (generation, rewards, update), timed by a callback; the table shows medians after ``--warmup`` steps,
of the wall time and of the process's CPU time (with one thread, the work itself, whatever other processes' load).
TRL's GRPOConfig turns gradient checkpointing on by default; ``--no-gradient-checkpointing`` turns it off, as this
package's default is (``VLMPolicy(gradient_checkpointing=False)``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def dataset(n: int):
    """The prompts as a ``datasets.Dataset`` (what TRL's trainer requires)."""
    import datasets

    from app.formats import REASONING_INSTRUCTION
    from app.tasks.dots import DotsDataset

    # datasets 5.2 fingerprints a data set by pickling its state with dill, which fails here on pyarrow's MonthDayNano
    # type (PicklingError); nothing is cached in this benchmark, so a counter stands in for the fingerprint
    counter = iter(range(1 << 30))
    datasets.disable_caching()
    datasets.fingerprint.Hasher.hash = classmethod(lambda cls, value: f"{next(counter):016x}")
    samples = DotsDataset(n, seed=0, image_size=64, dot_radius=12)
    rows = [samples[i] for i in range(n)]
    return datasets.Dataset.from_dict(
        {
            "prompt": [
                [
                    {
                        "role": "user",
                        "content": [{"type": "image"}, {"type": "text", "text": s.question + REASONING_INSTRUCTION}],
                    }
                ]
                for s in rows
            ],
            "image": [s.images[0] for s in rows],
            "answer": [s.answer for s in rows],
            "task": [s.task for s in rows],
        }
    )


def reward_functions():
    """TRL reward functions around this package's accuracy and format rewards (TRL passes dataset columns as
    keyword arguments and completions as chat messages)."""
    from app.rewards import AccuracyReward, FormatReward
    from app.types import VisualSample

    def texts(completions):
        return [c[0]["content"] if isinstance(c, list) else c for c in completions]

    def accuracy(completions, answer, task, **_):
        samples = [VisualSample([], "", t, answer=a) for a, t in zip(answer, task, strict=True)]
        return AccuracyReward().score(texts(completions), samples).tolist()

    def format_(completions, **_):
        return FormatReward().score(texts(completions), [None] * len(completions)).tolist()

    return [accuracy, format_]


def run(
    mode: str, steps: int, warmup: int, model: str, gradient_checkpointing: bool = True
) -> tuple[list[float], list[float]]:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from app.tiny.models import resolve_pretrained

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.cpu: list[float] = []  # process CPU seconds: what load from other processes changes least

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)
            self.cpu.append(time.process_time() - self._cpu)

    torch.manual_seed(0)
    peft_config = None
    if mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        )
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            max_steps=warmup + steps,
            per_device_train_batch_size=32,
            num_generations=8,
            gradient_accumulation_steps=1,
            max_completion_length=32,
            temperature=1.0,
            beta=0.0,
            learning_rate=1e-5,
            reward_weights=[1.0, 0.5],
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
            gradient_checkpointing=gradient_checkpointing,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=resolve_pretrained(model),
            reward_funcs=reward_functions(),
            args=config,
            train_dataset=dataset(4 * (warmup + steps + 1)),
            peft_config=peft_config,
            callbacks=[timer],
        )
        trainer.train()
    return timer.times[warmup:], timer.cpu[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument(
        "--no-gradient-checkpointing",
        dest="gradient_checkpointing",
        action="store_false",
        help="turn off TRL's default gradient checkpointing (this package's default is off)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import trl

    print(
        f"TRL {trl.__version__} GRPOTrainer, {args.model}, 4 prompts x 8 x 32 tokens, float32, {args.threads} threads, "
        f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}"
    )
    print("| mode | step (s), median | range | CPU (s), median |")
    print("|---|---|---|---|")
    for mode in args.modes:
        times, cpu = run(mode, args.steps, args.warmup, args.model, args.gradient_checkpointing)
        print(
            f"| {mode} | {statistics.median(times):.3f} | {min(times):.3f}-{max(times):.3f} "
            f"| {statistics.median(cpu):.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
