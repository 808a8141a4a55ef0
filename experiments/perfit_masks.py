"""PerFIT's masks, beside its table: from one PerFIT run's last checkpoint, the kept share of the expanded
LoRA entries per layer and module, and how far the clients' masks overlap (Jaccard), grouped by how many
data categories two clients share: do clients with similar data search similar masks?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments import plots


def mask_plot(run_dir: Path, path: Path) -> dict[str, Any]:
    """Kept share per layer and module, and the overlap (Jaccard) of the clients' masks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedtune.fl.aggregate import unpack_mask
    from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint

    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return {}
    masks = load_checkpoint(checkpoint)["algorithm"]["masks"]
    clients = sorted(masks)
    shapes = _shapes(run_dir)
    flat = {c: {k: unpack_mask(v, shapes[k]) for k, v in masks[c].items()} for c in clients}
    keys = list(shapes)
    modules = sorted({_module(k)[1] for k in keys})
    layers = sorted({_module(k)[0] for k in keys})
    share = np.zeros((len(modules), len(layers)))
    for key in keys:
        layer, module = _module(key)
        kept = np.mean([flat[c][key].mean() for c in clients])
        share[modules.index(module), layers.index(layer)] += kept / 2  # A and B of one module
    vectors = {c: np.concatenate([flat[c][k].ravel() for k in keys]) for c in clients}
    overlap = np.array(
        [
            [(vectors[a] & vectors[b]).sum() / max(1, (vectors[a] | vectors[b]).sum()) for b in clients]
            for a in clients
        ]
    )
    stats = json.loads((run_dir / "data_stats.json").read_text())["counts"]
    categories = {c: {k for k, n in stats.get(c, {}).items() if n} for c in clients}
    by_shared = overlap_by_shared(overlap, clients, categories)
    order = sorted(range(len(clients)), key=lambda i: (sorted(categories[clients[i]]), clients[i]))
    clients = [clients[i] for i in order]  # clients with the same categories side by side
    overlap = overlap[np.ix_(order, order)]
    labels = [f"{c}: {'/'.join(sorted(categories[c]))[:28]}" for c in clients]
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1.4, 1]})
    image = left.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    left.set_yticks(range(len(modules)), modules)
    left.set_xticks(range(len(layers)), [str(i) for i in layers], fontsize=7)
    left.set_xlabel("layer")
    left.set_title("kept share of the expanded LoRA entries (mean over clients)")
    figure.colorbar(image, ax=left)
    shown = overlap.copy()
    np.fill_diagonal(shown, np.nan)  # 1 by definition; it would squash the colour scale
    others = shown[~np.isnan(shown)]
    low, high = (float(others.min()), float(others.max())) if others.size else (0.0, 1.0)
    image = right.imshow(shown, cmap="magma", vmin=low, vmax=max(high, low + 1e-6))
    if len(clients) <= 30:
        right.set_xticks(range(len(clients)), clients, rotation=90, fontsize=7)
        right.set_yticks(range(len(clients)), labels, fontsize=7)
    else:  # too many to name: ordered by categories, so blocks are clients of the same two
        right.set_xlabel(f"{len(clients)} clients, ordered by their categories")
    shared = sorted(by_shared, reverse=True)
    means = " / ".join(f"{by_shared[k]['mean']:.2f}" for k in shared)
    right.set_title(
        "mask overlap between clients (Jaccard)\n"
        f"mean for pairs sharing {' / '.join(map(str, shared))} categories: {means}",
        fontsize=9,
    )
    figure.colorbar(image, ax=right)
    figure.tight_layout()
    plots.save_figure(figure, path, dpi=110)
    plt.close(figure)
    return {
        "share": share.tolist(),
        "modules": modules,
        "layers": layers,
        "overlap": overlap.tolist(),
        "clients": clients,
        "by_shared": {str(k): v for k, v in by_shared.items()},
    }


def overlap_by_shared(
    overlap: np.ndarray, clients: list[str], categories: dict[str, set[str]]
) -> dict[int, dict[str, float]]:
    """Number of data categories two clients share -> pairs and mean overlap of their masks over
    every pair of distinct clients: do clients with similar data search similar masks?"""
    groups: dict[int, list[float]] = {}
    for i, a in enumerate(clients):
        for j in range(i + 1, len(clients)):
            shared = len(categories[a] & categories[clients[j]])
            groups.setdefault(shared, []).append(float(overlap[i, j]))
    return {
        k: {"pairs": len(v), "mean": float(np.mean(v)), "std": float(np.std(v))} for k, v in groups.items()
    }


def overlap_lines(masks: dict[str, Any]) -> list[str]:
    by_shared = masks.get("by_shared") or {}
    if not by_shared:
        return []
    cells = [
        f"{k} shared: {v['mean']:.3f} ± {v['std']:.3f} ({v['pairs']} pairs)"
        for k, v in sorted(by_shared.items(), key=lambda kv: -int(kv[0]))
    ]
    return [
        "",
        f"Mask overlap (Jaccard) between the {len(masks['clients'])} searched clients of one PerFIT run, "
        "by the number of data categories two clients share: " + "; ".join(cells) + ".",
    ]


def _module(key: str) -> tuple[int, str]:
    parts = key.split(".")
    layer = int(parts[parts.index("layers") + 1])
    return layer, parts[parts.index("layers") + 3]


def _shapes(run_dir: Path) -> dict[str, tuple[int, ...]]:
    from fedtune.algorithms.perfit import PerFIT
    from fedtune.config import load_run_config
    from fedtune.resources import Resources

    cfg = load_run_config(run_dir)
    return PerFIT(cfg).module_shapes(Resources(cfg))
