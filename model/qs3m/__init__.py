"""QS3M, the query-specific Siamese similarity metric for passages (the second seed paper).

    pairs.py    queries (articles) from the pipeline's passages records; balanced same / different
                cluster pairs (TF-free)
    network.py  layers, loss and the three models (QS3M, QSS, QS3M-no-q)
    data.py     the passages file read, embedded once with a fixed encoder, as a pair dataset
    train.py    Qs3mConfig and the trainer: `python -m model.qs3m`

Its benchmark (clustering each test query's passages, against embedding and topic baselines) is
`eval.qs3m`.
"""
