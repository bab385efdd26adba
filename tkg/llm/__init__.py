"""The LLM seam: one typed call, a scripted double for tests, and an OpenAI-compatible client.

* :class:`LLMClient` -- ``generate(prompt, response_model) -> response_model instance``; a client that knows the
  tokens it used implements :class:`UsageReportingLLM` too.
* :class:`ScriptedLLM` -- deterministic double: a queue of answers or a handler function.
* :class:`tkg.llm.openai.OpenAILLM` -- instructor over the ``openai`` client (OpenAI, vLLM, Ollama, llama.cpp).
"""

from tkg.llm.base import LLMClient, LLMUsage, Prompt, ReaskingLLM, Tokens, UsageReportingLLM
from tkg.llm.guard import GuardedLLM, LLMPolicy
from tkg.llm.schema import ExtractedEntity, ExtractedFact, GraphExtraction, Resolution
from tkg.llm.scripted import ScriptedLLM

__all__ = [
    "ExtractedEntity",
    "ExtractedFact",
    "GraphExtraction",
    "GuardedLLM",
    "LLMClient",
    "LLMPolicy",
    "LLMUsage",
    "Prompt",
    "ReaskingLLM",
    "Resolution",
    "ScriptedLLM",
    "Tokens",
    "UsageReportingLLM",
]
