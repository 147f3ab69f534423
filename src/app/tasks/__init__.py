"""Procedural task generators, one sub-package per paper: seeded data sets of ``VisualSample`` prompts
(:class:`~app.tasks.base.SeededDataset`) that :class:`app.data.VisualTaskDataModule` serves (its ``dataset`` is one
of these classes), and shard writers (``python -m app.tasks <generator> --out DIR``).

- :mod:`app.tasks.dots`: the CPU-sized toy tasks of the quickstart and the CPU recipes (dots left-of, paired dots,
  dot-count triplets, counting, transformations, shape prompts for the flow models).
- :mod:`app.tasks.spatial`: OT-GRPO's spatial VQA from 3D boxes ("The Art of Interrogation").
- :mod:`app.tasks.core`: CoRe's metadata-driven comparison triplets (TriSR).
- :mod:`app.tasks.reason_rft`: Reason-RFT's visual counting, structure perception and spatial transformation suites.
- :mod:`app.tasks.vbvr`: VBVR-Pro's procedural visual reasoning tasks: the task programs and their classical-CV
  scorers, the scorers as a reward, generation prompts and shards.

The papers are listed in docs/algorithms.md#papers. Tasks import :mod:`app.data` (shards, schema) and never the
training modules; :mod:`app.data` and :mod:`app.rewards` never import tasks.
"""
