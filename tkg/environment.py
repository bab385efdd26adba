"""The embedder and LLM a command line runs with, from its ``--embedder`` option and the environment.

``tkg``, ``tkg-mcp`` and ``tkg-http`` all choose them here, and read the environment when a command runs (never at
import):

* ``TKG_LLM_BASE_URL`` (enables LLM extraction of messages), ``TKG_LLM_MODEL`` (default ``gpt-4o-mini``),
  ``TKG_LLM_API_KEY`` (else ``OPENAI_API_KEY``), ``TKG_LLM_MODE`` (``tools``, ``json``, ``json_schema``, ``md_json``);
* for ``--embedder openai``: ``TKG_EMBED_BASE_URL``, ``TKG_EMBED_MODEL``, ``TKG_EMBED_DIM``, ``TKG_EMBED_API_KEY``
  (else ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping

from tkg.cli_output import note
from tkg.embedders.base import Embedder
from tkg.embedders.hashing import HashEmbedder
from tkg.errors import ConfigurationError
from tkg.llm.base import LLMClient

__all__ = [
    "EMBEDDERS",
    "LOG_LEVELS",
    "add_log_option",
    "add_model_options",
    "describe_llm",
    "embedder_choice",
    "llm_from_env",
    "logging_to_stderr",
    "make_embedder",
]

#: The ``--embedder`` choices every command line offers.
EMBEDDERS = ("auto", "minilm", "hash", "openai")


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_option(parser: argparse.ArgumentParser, default: str = "warning") -> None:
    """Add ``--log-level`` (read by :func:`configure_logging`)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        help=f"what tkg logs on stderr (default {default}; debug: a line per episode; info: the HTTP access log)",
    )


@contextlib.contextmanager
def logging_to_stderr(level: str) -> Iterator[None]:
    """While a command line or a server runs: tkg's log records of ``level`` and above go to stderr (other
    libraries' logging is left as it was), and the ``tkg`` logger is as it was afterwards. The library itself
    configures no handler: an application that embeds tkg decides where its records go."""
    logger = logging.getLogger("tkg")
    handler = logging.StreamHandler()  # the stderr of now
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.getLevelNamesMapping()[level.upper()])
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--embedder`` (read by :func:`make_embedder`) and ``--no-llm`` (skip :func:`llm_from_env`)."""
    parser.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default="auto",
        help="auto: MiniLM if the 'embed' extra is installed, else hash. Must match the snapshot's embedder.",
    )
    parser.add_argument("--no-llm", action="store_true", help="ignore TKG_LLM_BASE_URL: no LLM extraction")


def make_embedder(choice: str, env: Mapping[str, str] | None = None) -> Embedder:
    """The embedder named by ``--embedder``; ``auto`` falls back to hashing (with a note) without the extra."""
    env = os.environ if env is None else env
    if choice == "hash":
        return HashEmbedder()
    if choice == "openai":
        return _openai_embedder(env)
    from tkg.embedders.onnx import MiniLMEmbedder  # lazily: onnxruntime is an optional extra

    if choice == "minilm":
        return MiniLMEmbedder()
    try:
        return MiniLMEmbedder()
    except ConfigurationError:
        note('the "embed" extra is not installed, so the hash embedder is used (pip install "tkg[embed]")')
        return HashEmbedder()


def _openai_embedder(env: Mapping[str, str]) -> Embedder:
    from tkg.embedders.openai import OpenAIEmbedder

    model = env.get("TKG_EMBED_MODEL") or "text-embedding-3-small"
    dim_text = env.get("TKG_EMBED_DIM") or ("1536" if model == "text-embedding-3-small" else "")
    if not dim_text:
        raise ConfigurationError(f"--embedder openai: set TKG_EMBED_DIM to the vector size of {model!r}")
    try:
        dim = int(dim_text)
    except ValueError:
        raise ConfigurationError(f"TKG_EMBED_DIM must be an integer, got {dim_text!r}") from None
    return OpenAIEmbedder(
        model,
        dim,
        base_url=env.get("TKG_EMBED_BASE_URL") or None,
        api_key=env.get("TKG_EMBED_API_KEY") or env.get("OPENAI_API_KEY") or "sk-no-key",
    )


def embedder_choice(stored_name: str) -> str:
    """The ``--embedder`` value that reproduces an embedder name stored in a snapshot.

    >>> embedder_choice("hash-384-tri"), embedder_choice("openai:text-embedding-3-small:1536")
    ('hash', 'openai (with TKG_EMBED_MODEL=text-embedding-3-small TKG_EMBED_DIM=1536)')
    """
    if stored_name.startswith("hash-"):
        return "hash"
    if stored_name.startswith("all-MiniLM"):
        return "minilm"
    if stored_name.startswith("openai:"):
        _, model, dim = [*stored_name.split(":", 2), "", ""][:3]
        return f"openai (with TKG_EMBED_MODEL={model} TKG_EMBED_DIM={dim})"
    return f"<one that makes {stored_name!r}>"


def llm_from_env(env: Mapping[str, str] | None = None) -> LLMClient | None:
    """An :class:`OpenAILLM` when ``TKG_LLM_BASE_URL`` is set, else ``None`` (no extraction)."""
    env = os.environ if env is None else env
    base_url = env.get("TKG_LLM_BASE_URL", "").strip()
    if not base_url:
        return None
    from tkg.llm.openai import OpenAILLM

    return OpenAILLM(
        env.get("TKG_LLM_MODEL") or "gpt-4o-mini",
        base_url=base_url,
        api_key=env.get("TKG_LLM_API_KEY") or env.get("OPENAI_API_KEY") or "sk-no-key",
        mode=env.get("TKG_LLM_MODE") or "tools",
    )


def describe_llm(llm: LLMClient | None) -> str:
    """``model at endpoint`` for an LLM client, ``none`` without one."""
    if llm is None:
        return "none"
    from tkg.llm.openai import OpenAILLM

    if isinstance(llm, OpenAILLM):
        return f"{llm.model} at {llm.endpoint}"
    return type(llm).__name__
