"""What a checkpoint holds: iteration, layout, config, and every parameter's shape and norm.

    print(format_summary(summarize(CheckpointReader("checkpoints"))))

Norms are of the full (merged) tensors, in fp32, so the same model gives the same table at
any layout: a quick check that a conversion or reshard moved the weights intact.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron.checkpoint_tools.experts import saved_expert_parallel_size

MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "seq_length",
    "norm",
    "pos_emb",
    "rotary_pct",
    "activation",
    "gpt_j_residual",
    "no_weight_tying",
    "padded_vocab_size",
)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def summarize(reader, *, norms: bool = True) -> dict:
    """A JSON-serialisable description of the checkpoint `reader` reads."""
    layout, cfg = reader.layout, reader.cfg
    trainer = reader.trainer_state() or {}
    params, total = [], 0
    for layer in range(reader.schema.num_spec_layers):
        for name, tensor in (reader.layer_state(layer) if norms else {}).items():
            total += tensor.numel()
            params.append(
                {
                    "name": name,
                    "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "norm": float(tensor.float().norm()),
                }
            )
    if not norms:
        for spec in reader.schema.params.values():
            total += int(torch.Size(spec.shape).numel())
            params.append({"name": spec.name, "shape": list(spec.shape)})
    return {
        "folder": str(layout.folder),
        "iteration": trainer.get("iteration", layout.iteration),
        "consumed_samples": trainer.get("consumed_samples"),
        "layout": {
            "model_parallel_size": layout.tp,
            "pipe_parallel_size": layout.pp,
            "zero_stage": getattr(cfg.parallel, "zero_stage", 0),
            "data_parallel_size": getattr(cfg.parallel, "data_parallel_size", None),
            # what the loaders read (config.json); the experts' slices: expert_states_*.pt
            "moe_expert_parallel_size": saved_expert_parallel_size(layout.folder),
        },
        "model": {k: getattr(cfg.model, k, None) for k in MODEL_KEYS},
        "precision": getattr(cfg.precision, "dtype", None),
        "optimizer": getattr(cfg.optimizer, "optimizer_type", None),
        "size_bytes": _folder_bytes(layout.folder),
        "parameters": total,
        "tensors": params,
    }


def format_summary(summary: dict) -> str:
    """The summary as text: a header, then one line per tensor."""
    lay = summary["layout"]
    lines = [
        f"checkpoint  {summary['folder']}",
        f"iteration   {summary['iteration']} (consumed samples {summary['consumed_samples']})",
        f"layout      tp={lay['model_parallel_size']} pp={lay['pipe_parallel_size']} "
        f"zero={lay['zero_stage']} dp={lay['data_parallel_size']}"
        f" ep={lay.get('moe_expert_parallel_size', 1)}",
        f"precision   {summary['precision']}, {summary['size_bytes'] / 2**20:.1f} MiB on disk",
        f"optimizer   {summary['optimizer']}",
        "model       " + ", ".join(f"{k}={v}" for k, v in summary["model"].items()),
        f"parameters  {summary['parameters']:,}",
    ]
    if "resume" in summary:
        lines.append(f"resume      {summary['resume']['verdict']}: {summary['resume']['reason']}")
    lines.append("")
    width = max((len(t["name"]) for t in summary["tensors"]), default=10)
    for t in summary["tensors"]:
        shape = "x".join(str(d) for d in t["shape"])
        extra = f"  {t['dtype']:>8}  norm {t['norm']:.6g}" if "norm" in t else ""
        lines.append(f"{t['name']:<{width}}  {shape:>14}{extra}")
    return "\n".join(lines)
