"""The caption an action model reads: the robot's prompt plus the clip's metadata, in its training format.

Two formats exist, and a policy profile says which one its checkpoint was trained with:

- ``json``: the structured action caption (view point framing, the task with its time span, duration,
  fps, resolution, aspect ratio), built by diffusers' own ``Cosmos3OmniPipeline._build_action_json_prompt``.
  cosmos-framework trains with this format when ``format_prompt_as_json`` is set, as for Edge.
- ``prose``: cosmos-framework's default caption, plain sentences appended to the task: the view point
  sentence, then ``The video is {seconds:.1f} seconds long and is of {fps:.0f} FPS.``, then
  ``This video is of {H}x{W} resolution.``. Each is joined with a space after a full stop and with
  ``". "`` otherwise; the duration is whole seconds (the framework truncates it; diffusers' own video
  template keeps the fraction), and an empty task stays empty (the framework appends nothing to it).

A composed view (``concat_view``) says in its profile's ``view_description`` how the cameras are laid
out; the framework appends that to the view point sentence in both formats, and so does this module.
The templates themselves are diffusers' (the view point sentences and the duration and resolution
templates), so the text matches what the pipeline would write.
"""

from __future__ import annotations

import json
from typing import Any

from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_VIEWPOINT_TEMPLATES


def action_caption(
    pipe: Any,
    prompt: str,
    *,
    prompt_format: str,
    view_point: str,
    view_description: str | None,
    num_frames: int,
    fps: float,
    height: int,
    width: int,
) -> str:
    """The conditional caption for one action request, ``height`` x ``width`` being the padded canvas."""
    if prompt_format == "prose":
        return _prose(pipe, prompt, view_point, view_description, num_frames, fps, height, width)
    caption = pipe._build_action_json_prompt(
        prompt, view_point=view_point, num_frames=num_frames, fps=fps, height=height, width=width
    )
    if not view_description:
        return str(caption)
    data = json.loads(caption)
    framing = data.get("cinematography", {}).get("framing")
    # json.dumps of the parsed caption reproduces diffusers' text byte for byte, the framing aside.
    data.setdefault("cinematography", {})["framing"] = _join(framing, view_description) if framing else view_description
    return json.dumps(data)


def _prose(
    pipe: Any,
    prompt: str,
    view_point: str,
    view_description: str | None,
    num_frames: int,
    fps: float,
    height: int,
    width: int,
) -> str:
    caption = prompt.rstrip()
    if not caption:
        return ""
    view = _ACTION_VIEWPOINT_TEMPLATES.get(view_point)
    if view:
        caption = _join(caption, _join(view, view_description) if view_description else view)
    seconds = int(num_frames / fps)
    caption = _join(caption, pipe.duration_template.format(duration=seconds, fps=fps))
    return _join(caption, pipe.video_resolution_template.format(height=height, width=width))


def _join(text: str, sentence: str) -> str:
    return text + (" " if text.endswith(".") else ". ") + sentence.rstrip()
