"""muP's coordinate check as PNG plots (GPT-NeoX's `coord_check`): the configured model is
the base; copies at several widths train a few Adam steps on the same random tokens, with and
without muP, and the mean |activation| of each layer and of the logits is plotted against the
width, one panel per step. Under muP the lines stay flat; without it they climb.

    python tools/coord_check.py configs/125M.yml --widths 128,256,512,1024 --out coord

writes `coord/coord_check_sp.png` and `coord/coord_check_mup.png` (and the numbers as JSON).
Runs on the CPU, one process; needs matplotlib (`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import config_from_files  # noqa: E402
from megatron.config import ConfigError  # noqa: E402
from megatron.errors import run_tool  # noqa: E402
from megatron.model.args import ModelArgs  # noqa: E402
from megatron.model.mup_coord import coord_data  # noqa: E402


def plot(data: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted(data)
    modules = list(data[widths[0]])
    steps = len(data[widths[0]][modules[0]])
    fig, axes = plt.subplots(1, steps, figsize=(4 * steps, 3.5), sharey=True, squeeze=False)
    for step, ax in enumerate(axes[0]):
        for module in modules:
            ax.plot(widths, [data[w][module][step] for w in widths], marker="o", label=module)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width (hidden_size)")
        ax.set_title(f"step {step + 1}")
    axes[0][0].set_ylabel("mean |activation|")
    axes[0][-1].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="+", help="the run's config files (the base model)")
    parser.add_argument("--widths", default=None, help="hidden sizes, e.g. 128,256,512")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=64, help="tokens per sample")
    parser.add_argument("--out", default=".", help="folder for the PNGs and JSON")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "tools/coord_check.py draws with matplotlib: pip install matplotlib"
        ) from err
    cfg = config_from_files(args.config)
    base = ModelArgs.from_config(cfg)
    base = dataclasses.replace(
        base, seq_length=args.seq_length, use_mup=False, pipe_parallel_size=0
    )
    heads = base.num_attention_heads
    widths = (
        [int(w) for w in args.widths.split(",")]
        if args.widths
        else [heads * 2**p for p in range(2, 6)]  # GPT-NeoX's heads × 2^p, CPU-sized
    )
    bad = [w for w in widths if w % heads]
    if bad:
        raise ConfigError(f"--widths {bad} are not divisible by num_attention_heads {heads}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    numbers = {}
    for name, mup in (("sp", False), ("mup", True)):
        data = coord_data(base, widths, mup=mup, lr=args.lr, steps=args.steps, batch=args.batch)
        numbers[name] = data
        label = "muP" if mup else "standard parametrisation"
        plot(
            data,
            f"coordinate check, {label} (base width {base.hidden_size})",
            out / f"coord_check_{name}.png",
        )
    (out / "coord_check.json").write_text(json.dumps(numbers, indent=1))
    print(f"wrote {out}/coord_check_sp.png, {out}/coord_check_mup.png, {out}/coord_check.json")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
