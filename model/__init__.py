"""The triplet network, its trainer, and every sentence encoder the evaluation jobs score."""
import importlib.util
import sys

# The `minilm` extra's PyTorch crashes the process (a segfault importing torch._dynamo, which
# transformers imports) when TensorFlow's libraries were loaded first; loaded before them, both
# work. So with the extra installed, importing `model` loads it first when it still can
# (`model.encoders.MiniLMEncoder` names the import order otherwise).
if "tensorflow" not in sys.modules and importlib.util.find_spec("sentence_transformers"):
    import torch._dynamo  # noqa: F401
