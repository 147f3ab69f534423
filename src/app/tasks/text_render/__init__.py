"""Text rendering for the tiny flow models: prompts asking for a short word in a scene, with the target picture
(:class:`TextRenderDataset`), scored by :class:`app.rewards.ocr.OCRReward`."""

from app.tasks.text_render.dataset import SCENES, WORDS, TextRenderDataset, render_text, text_prompt

__all__ = ["SCENES", "WORDS", "TextRenderDataset", "render_text", "text_prompt"]
