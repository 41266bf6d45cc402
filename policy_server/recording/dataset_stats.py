"""Per-feature statistics in LeRobot's shape: ``min``, ``max``, ``mean``, ``std``, ``count`` and quantiles.

LeRobot normalizes with these (``meta/stats.json`` and each episode's ``stats/...`` columns), and its
``aggregate_stats`` merges them across episodes and datasets, so the shapes follow its
``compute_episode_stats``:

- a numeric feature of shape (D,) or (H, D): one value per last dimension, over every frame (and every
  chunk step); ``count`` is the number of frames;
- a camera: one value per channel, shape (3, 1, 1), in [0, 1]; ``count`` is the number of frames.

Cameras are summarized without keeping frames: each frame adds its (subsampled) pixels to one 256-bin
histogram per channel, from which every statistic follows exactly, quantiles included. Frames with no
value (the chunk of an observation that got none, a timing not measured) are left out of the numeric
statistics by a mask, and a feature no frame has a value for gets none (LeRobot's ``aggregate_stats``
divides by the count).
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
# Pixels are sampled on a grid about this many pixels wide (LeRobot also downsamples to ~150 px).
HISTOGRAM_TARGET_SIDE = 150


def numeric_stats(values: np.ndarray, kept: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Statistics of ``values`` (frames first) per last dimension, over the frames ``kept`` (a boolean
    mask; default all)."""
    values = np.asarray(values)
    if kept is not None:
        values = values[kept]
    width = 1 if values.ndim == 1 else values.shape[-1]
    flat = values.reshape(-1, width)
    count = np.array([values.shape[0]], dtype=np.int64)
    if flat.shape[0] == 0:  # no frame has a value: only the count means anything
        zeros = np.zeros(width, dtype=np.float64)
        return {
            "min": zeros,
            "max": zeros,
            "mean": zeros,
            "std": zeros,
            "count": count,
            **{key: zeros for key in QUANTILE_KEYS},
        }
    as_float = flat.astype(np.float64)
    stats = {
        "min": flat.min(axis=0),
        "max": flat.max(axis=0),
        "mean": as_float.mean(axis=0),
        "std": as_float.std(axis=0),
        "count": count,
    }
    for key, value in zip(QUANTILE_KEYS, np.quantile(as_float, QUANTILES, axis=0)):
        stats[key] = value
    return stats


def channel_histograms(frames: np.ndarray) -> np.ndarray:
    """Pixel counts per channel and value (3×256 int64) of T×H×W×3 uint8 ``frames``, on a sampled grid."""
    height, width = frames.shape[1], frames.shape[2]
    stride = max(1, max(height, width) // HISTOGRAM_TARGET_SIDE)
    sample = frames[:, ::stride, ::stride, :]
    return np.stack([np.bincount(sample[..., c].reshape(-1), minlength=256) for c in range(3)]).astype(np.int64)


def image_stats(histograms: np.ndarray, frames: int) -> dict[str, np.ndarray]:
    """LeRobot's per-channel camera statistics (each (3, 1, 1), in [0, 1]) from :func:`channel_histograms`."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    totals = histograms.sum(axis=1).astype(np.float64)
    seen = histograms > 0
    mean = (histograms * levels).sum(axis=1) / totals
    variance = (histograms * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / totals
    cumulative = np.cumsum(histograms, axis=1) / totals[:, None]

    def per_channel(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(3, 1, 1)

    stats = {
        "min": per_channel([levels[np.argmax(row)] for row in seen]),
        "max": per_channel([levels[255 - np.argmax(row[::-1])] for row in seen]),
        "mean": per_channel(mean),
        "std": per_channel(np.sqrt(variance)),
        "count": np.array([frames], dtype=np.int64),
    }
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        stats[key] = per_channel([levels[min(255, int(np.searchsorted(row, q)))] for row in cumulative])
    return stats
