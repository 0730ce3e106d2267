"""The run's data: training length, datasets sized for it, per-rank batch iterators."""

from __future__ import annotations

from megatron.training.setup.batches import BatchSettings, ModelBatches


def resolve_train_iters(cfg) -> int:
    """`train_iters`, or the iterations of `train_epochs` passes over the training data."""
    t = cfg.training
    if t.train_epochs:
        from megatron.data import iters_for_epochs, train_samples_per_epoch

        return iters_for_epochs(t.train_epochs, train_samples_per_epoch(cfg), t.train_batch_size)
    if not t.train_iters:
        raise ValueError("set train_iters (optimizer steps) or train_epochs (passes over the data)")
    return int(t.train_iters)


def train_samples_needed(train_iters: int, global_batch: int, resumed: dict | None = None) -> int:
    """Training samples the datasets are built for: `train_iters` × the global batch on a
    fresh run (GPT-NeoX's count). On resume, the samples already consumed plus the remaining
    iterations at this run's batch size (which may differ from the saved run's), and never
    fewer than the saved run built: the shuffled order depends on the count only through the
    number of passes over the data, so building the same count again gives the same order and
    the run continues the very stream the saved one read."""
    if not resumed:
        return train_iters * global_batch
    left = max(0, train_iters - int(resumed["iteration"]))
    needed = int(resumed["consumed_samples"]) + left * global_batch
    return max(needed, int(resumed.get("train_samples") or 0))


def build_datasets(cfg, train_iters: int, train_samples: int | None = None):
    """(train, valid, test) datasets holding every sample the run will read (collective);
    `train_samples`: the training split's count when resuming (`train_samples_needed`)."""
    from megatron.data import build_train_valid_test_datasets, train_valid_test_num_samples

    t = cfg.training
    samples = train_valid_test_num_samples(
        train_iters, t.eval_interval, t.eval_iters, t.train_batch_size
    )
    if train_samples is not None:
        samples[0] = train_samples
    return build_train_valid_test_datasets(cfg, samples)


def valid_samples_consumed(cfg, iteration: int) -> int:
    """Where the validation iterator starts at `iteration`: the samples the evaluations
    before it read (each continues where the previous stopped), or 0 with
    `eval_fixed_samples`."""
    t = cfg.training
    if not t.eval_interval or t.eval_fixed_samples:  # every evaluation starts at the start
        return 0
    return (iteration // t.eval_interval) * t.eval_iters * t.train_batch_size


class BatchFactory:
    """Makes this rank's model-input iterators over a dataset from a consumed-sample count."""

    def __init__(self, cfg, topology, settings: BatchSettings, device=None, objective=None):
        self.micro_batch = cfg.training.train_micro_batch_size_per_gpu
        self.num_workers = cfg.data.num_workers
        self.dp_rank, self.dp_size = topology.dp_rank, topology.dp_size
        self.settings = settings
        self.device = device
        self.objective = objective

    def __call__(self, dataset, consumed_samples: int) -> ModelBatches | None:
        if dataset is None:
            return None
        from megatron.data import build_data_iterator

        samples = build_data_iterator(
            dataset,
            consumed_samples,
            self.micro_batch,
            self.dp_rank,
            self.dp_size,
            num_workers=self.num_workers,
        )
        return ModelBatches(samples, self.settings, self.device, self.objective)
