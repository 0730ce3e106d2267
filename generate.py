"""Worker entry point, started by `deepy.py` on every rank: decode the config bundle, generate.

    python deepy.py generate.py configs/small.yml local.yml \\
        --set text_gen_type=input-file --set sample_input_file=prompts.txt

Settings are the `generation` config keys (text_gen_type, temperature, top_k, top_p,
maximum_tokens, recompute, sample_input_file, sample_output_file, num_samples); the weights
come from `load` (any tensor/pipeline layout). `text_gen_type: precompute` instead writes the
model's per-token log-probs of the run's datasets as `{prefix}_{precompute_model_name}`
(`megatron/inference/precompute.py`), the reference of DPO/KTO.
"""

from megatron.config import config_from_argv
from megatron.config.verbosity import setup_worker_logging
from megatron.errors import run_worker


def main(argv: list[str] | None = None) -> None:
    setup_worker_logging(argv)
    cfg = config_from_argv(argv)
    if cfg.generation.text_gen_type == "precompute":
        from megatron.inference.precompute import precompute_from_config

        precompute_from_config(cfg)
        return
    from megatron.inference import generate_from_config

    generate_from_config(cfg)


if __name__ == "__main__":
    run_worker(main)
