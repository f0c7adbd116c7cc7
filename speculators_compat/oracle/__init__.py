"""The oracle: hidden states from an independent source, to check captured ones against.

``reference`` runs a checkpoint's decoder in transformers (float32) and returns every layer's
output; ``layer_probe`` runs the same checkpoint in a real in-process vLLM engine and returns its
per-layer outputs through forward hooks. Tooling: importing these modules patches nothing.
"""
