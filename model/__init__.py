"""The triplet network, its trainer, and every sentence encoder the evaluation jobs score.

Importing `model` loads nothing heavy (no TensorFlow, no PyTorch): each module imports what it
uses, and the entry points parse their flags first. What it does set is TensorFlow's C++ log
level, quiet by default (`TF_CPP_MIN_LOG_LEVEL=3`); set the variable yourself (e.g. to 0)
to bring TensorFlow's logs back.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
