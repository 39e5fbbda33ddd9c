"""The figure of a ``trainers.scaling`` measurement: each run's step split into compute,
exposed communication, data wait and host overhead (stacked bars, ms), and its tokens/s per
device with the scaling efficiency. matplotlib is imported only to draw.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from trainers.scaling.report import PART_NAMES, Phase, efficiency

_COLOURS = {"compute_s": "#4C72B0", "exposed_comm_s": "#C44E52", "data_wait_s": "#DD8452",
            "host_s": "#8C8C8C"}


def render(phases: Sequence[Phase], image_format: str = "png") -> bytes:
    """The figure of ``phases`` (the 1-process run first) as an image file's bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 1.6 + 0.9 * len(phases)), layout="constrained")
    steps, rates = fig.subplots(1, 2, width_ratios=[3, 2])
    names = [p.name for p in phases]
    rows = range(len(phases))
    left = [0.0] * len(phases)
    for part, label in PART_NAMES.items():
        widths = [getattr(p.breakdown, part) * 1e3 for p in phases]
        steps.barh(rows, widths, left=left, color=_COLOURS[part], label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    steps.set(yticks=list(rows), yticklabels=names, xlabel="ms per step (profiled steps, mean "
              "over ranks)")
    steps.invert_yaxis()
    steps.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    steps.grid(axis="x", alpha=0.3)
    per_device = [p.per_device for p in phases]
    rates.barh(rows, per_device, color="#55A868")
    for row, phase in zip(rows, phases, strict=True):
        rates.text(phase.per_device, row, f" {efficiency(phases[0], phase):.2f}", va="center",
                   fontsize=9)
    rates.set(yticks=list(rows), yticklabels=names, xlabel="tokens/s per device (label: "
              "scaling efficiency)")
    rates.invert_yaxis()
    rates.grid(axis="x", alpha=0.3)
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format=image_format)
    return image.getvalue()
