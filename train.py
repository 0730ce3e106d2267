"""Worker entry point, started by `deepy.py` on every rank: decode the config bundle, train."""

from megatron.config import config_from_argv
from megatron.config.verbosity import setup_worker_logging
from megatron.errors import run_worker


def main(argv: list[str] | None = None) -> None:
    setup_worker_logging(argv)
    cfg = config_from_argv(argv)
    if cfg.mup.use_mup and cfg.mup.save_base_shapes:  # GPT-NeoX's step before a muP run
        from megatron.model.mup_shapes import save_base_shapes

        save_base_shapes(cfg)
        return
    from megatron.training import pretrain

    pretrain(cfg)


if __name__ == "__main__":
    run_worker(main)
