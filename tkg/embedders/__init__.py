"""The embedder seam and its implementations.

* :class:`HashEmbedder` -- deterministic, dependency-free; for tests and benchmarks.
* :class:`tkg.embedders.onnx.MiniLMEmbedder` -- all-MiniLM-L6-v2 (int8 ONNX), offline; extra ``embed``.
* :class:`tkg.embedders.openai.OpenAIEmbedder` -- any OpenAI-compatible ``/v1/embeddings`` endpoint.
"""

from tkg.embedders.base import Embedder, check_vectors
from tkg.embedders.hashing import HashEmbedder

__all__ = ["Embedder", "HashEmbedder", "check_vectors"]
