"""The written forms of a trained encoder that other tools load: a strings-in TensorFlow
SavedModel (TF Serving, Vertex AI) and a sentence-transformers / Hugging Face folder."""
