"""Every sentence encoder the evaluation jobs score, behind one `encode(list[str]) -> np.ndarray`:
the trained model's export, the baselines, off-the-shelf checkpoints; their cached embeddings and
the RunInference handler that runs any of them in a Beam pipeline."""
