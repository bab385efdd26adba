"""An embedder for any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, vLLM, Ollama, llama.cpp, TEI)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import openai

from tkg.embedders.base import check_vectors
from tkg.errors import EmbeddingError, LLMError, ValidationError
from tkg.llm.openai import describe_openai_error, make_openai_client


class OpenAIEmbedder:
    """:class:`tkg.embedders.Embedder` over an OpenAI-compatible ``/embeddings`` endpoint.

    Texts are sent in batches of ``batch_size``; vectors come back L2-normalised, as float32, in input order.
    A wrong dimension or count raises :class:`tkg.errors.EmbeddingError`; an unreachable or failing endpoint
    raises :class:`tkg.errors.LLMError`. Nothing is read from the environment. ``ask_dim``: the request asks for
    vectors of ``dim`` (OpenAI's ``dimensions``, which its text-embedding-3 models can shorten to; other models and
    many compatible servers refuse it).

    >>> emb = OpenAIEmbedder("text-embedding-3-small", 1536, api_key="sk-...")  # doctest: +SKIP
    >>> emb = OpenAIEmbedder("nomic-embed-text", 768, base_url="http://127.0.0.1:11434/v1")  # doctest: +SKIP
    >>> emb.embed(["hello", "world"]).shape  # doctest: +SKIP
    (2, 768)
    """

    def __init__(
        self,
        model: str,
        dim: int,
        *,
        base_url: str | None = None,
        api_key: str = "sk-no-key",
        batch_size: int = 256,
        timeout: float = 60.0,
        http_retries: int = 2,
        client: openai.OpenAI | None = None,
        ask_dim: bool = False,
    ) -> None:
        if not model:
            raise ValidationError("OpenAIEmbedder needs a model name")
        if dim < 1:
            raise ValidationError(f"OpenAIEmbedder dim must be positive, got {dim}")
        if batch_size < 1:
            raise ValidationError(f"batch_size must be positive, got {batch_size}")
        self._model = model
        self._dim = dim
        self._batch_size = batch_size
        self._ask_dim = ask_dim
        self._timeout = timeout if client is None else None
        self._client = client if client is not None else make_openai_client(base_url, api_key, timeout, http_retries)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def name(self) -> str:
        return f"openai:{self._model}:{self._dim}"

    @property
    def endpoint(self) -> str:
        return str(self._client.base_url).rstrip("/")

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if len(texts) == 0:
            return np.zeros((0, self._dim), dtype=np.float32)
        batches = [
            self._embed_batch(list(texts[start : start + self._batch_size]))
            for start in range(0, len(texts), self._batch_size)
        ]
        return batches[0] if len(batches) == 1 else np.concatenate(batches)

    def _embed_batch(self, batch: list[str]) -> npt.NDArray[np.float32]:
        try:
            # "float" explicitly: the openai client otherwise asks for base64, which some compatible servers reject.
            embeddings = self._client.embeddings
            if self._ask_dim:
                response = embeddings.create(
                    model=self._model, input=batch, encoding_format="float", dimensions=self._dim
                )
            else:
                response = embeddings.create(model=self._model, input=batch, encoding_format="float")
        except openai.OpenAIError as exc:
            raise LLMError(
                f"embeddings endpoint {self.endpoint} (model {self._model!r}) failed: "
                f"{describe_openai_error(exc, self._timeout)}"
            ) from exc
        items = sorted(response.data or [], key=lambda item: item.index)
        if len(items) != len(batch):
            raise EmbeddingError(
                f"embeddings endpoint {self.endpoint} returned {len(items)} vectors for {len(batch)} texts"
            )
        vectors = check_vectors([item.embedding for item in items], self._dim, len(batch))
        if [item.index for item in items] != list(range(len(batch))):
            raise EmbeddingError(
                f"embeddings endpoint {self.endpoint} returned indices {[item.index for item in items]}, "
                f"expected 0..{len(batch) - 1}"
            )
        return vectors
