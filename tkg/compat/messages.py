"""Chat messages as tkg episodes, one shared form for every adapter: a message is ``role``, ``content`` and an
optional ``name``; its episode's content is ``"Speaker: content"`` (the speaker is the name, else the role in
title case, and becomes an entity), its ``name`` the role, and its ``source_description`` says which adapter
wrote it, so that the message can be read back as it was."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from tkg.errors import ValidationError
from tkg.inputs import EpisodeInput
from tkg.models import Episode

__all__ = ["Message", "episode_inputs", "message_of", "parse_messages", "split_long"]

#: (role, speaker, content) of one message.
Message = tuple[str, str, str]


def parse_messages(
    messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]], *, skip_system: bool = False
) -> list[Message]:
    """Each message of a string (one user message), a ``{"role", "content", "name"}`` dict, or a list of them,
    checked; with ``skip_system`` the system messages are left out."""
    if isinstance(messages, str):
        listed: Iterable[Any] = [{"role": "user", "content": messages}]
    elif isinstance(messages, Mapping):
        listed = [messages]
    elif isinstance(messages, Sequence):
        listed = messages
    else:
        raise ValidationError(f"messages must be a string, a dict or a list of dicts, got {type(messages).__name__}")
    out = []
    for n, message in enumerate(listed):
        if not isinstance(message, Mapping):
            raise ValidationError(f"message {n} must be a dict with role and content, got {type(message).__name__}")
        role, content = message.get("role", "user"), message.get("content")
        if not isinstance(role, str) or not role.strip():
            raise ValidationError(f"message {n}: role must be a non-empty string")
        if skip_system and role == "system":
            continue
        if not isinstance(content, str) or not content.strip():
            raise ValidationError(f"message {n}: content must be a non-empty string")
        name = message.get("name")
        speaker = name.strip() if isinstance(name, str) and name.strip() else role.strip().title()
        if ":" in speaker or "\n" in speaker:
            raise ValidationError(f"message {n}: name {speaker!r} may not hold ':' or a newline")
        out.append((role.strip(), speaker, content.strip()))
    return out


def split_long(messages: Sequence[Message], max_episode_chars: int) -> list[Message]:
    """``messages`` with each one longer than an episode may be (``"Speaker: content"`` over
    ``max_episode_chars``) cut into consecutive messages that fit; parts with nothing but blanks are left out."""
    out: list[Message] = []
    for n, (role, speaker, content) in enumerate(messages):
        size = max_episode_chars - len(speaker) - 2
        if size < 1:
            raise ValidationError(f"message {n}: the speaker {speaker!r} leaves no room in an episode")
        parts = [content[at : at + size] for at in range(0, len(content), size)]
        out += [(role, speaker, part) for part in parts if part.strip()]
    return out


def episode_inputs(
    messages: Sequence[Message],
    group_id: str,
    source: str,
    *,
    reference_time: datetime | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> list[EpisodeInput]:
    """The episodes of these messages in one group, written by the adapter ``source``."""
    return [
        EpisodeInput(
            f"{speaker}: {content}",
            group_id,
            reference_time=reference_time,
            source_description=source,
            name=role,
            metadata=metadata or None,
        )
        for role, speaker, content in messages
    ]


def message_of(episode: Episode, source: str) -> Message:
    """(role, speaker, content) of an episode an adapter ``source`` wrote; any other episode is a user message
    whose content is the episode's."""
    if episode.source_description != source:
        return episode.name or "user", "", episode.content
    speaker, _, text = episode.content.partition(": ")
    return episode.name or "user", speaker, text
