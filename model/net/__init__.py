"""The triplet network, written once in Keras (the head in `keras.ops`), so the TensorFlow and the
JAX backend build and train the same model: the word-vector BiLSTM and the transformer Nets, their
tokenizers, and the head's distances, losses and accuracy."""
