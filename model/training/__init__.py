"""What a training run needs around the network: the input streamed from a pipeline run's shards,
the trainer's own callbacks, the model dir (its files, staged remote folders, folder claims) and
the curves drawn into it. `model.train` and `model.soup` compose them."""
