"""Typed response models of the prompts (instructor validates the LLM's output against these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator


class ExtractedEntity(BaseModel):
    """An entity named in the current episode."""

    name: str = Field(description="The entity's name as written, most complete form (e.g. 'Alice Smith').")
    label: str = Field(
        default="Entity", description="A short type such as Person, Organization, Place, Event, Object, Concept."
    )
    summary: str = Field(default="", description="One sentence on what the episode says about this entity.")
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="Values of the attributes its declared type lists, if any were stated."
    )


class ExtractedFact(BaseModel):
    """A relation between two entities stated in the current episode."""

    source: str = Field(description="Name of the subject entity (one of the extracted entities).")
    target: str = Field(description="Name of the object entity (one of the extracted entities).")
    relation: str = Field(description="Relation type in SCREAMING_SNAKE_CASE, e.g. WORKS_AT, LIVES_IN.")
    fact: str = Field(description="A self-contained sentence stating the fact, with names, not pronouns.")
    valid_from: str | None = Field(
        default=None,
        description=(
            "When the fact started to hold: the time phrase copied from the text (e.g. 'two weeks ago', "
            "'in 2019', 'last summer') or an ISO-8601 date; 'now' for present tense; null if not said."
        ),
    )
    valid_until: str | None = Field(
        default=None, description="When the fact stopped holding, same form as valid_from; null if it still holds."
    )
    extra_sources: list[str] = Field(
        default_factory=list,
        description="Other subjects the same fact holds for (e.g. all founders in 'A, B and C founded D').",
    )
    extra_targets: list[str] = Field(default_factory=list, description="Other objects the same fact holds for.")
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="Values of the attributes its declared relation type lists, if stated."
    )


class GraphExtraction(BaseModel):
    """Entities and facts of one episode."""

    entities: list[ExtractedEntity] = Field(default_factory=list)
    facts: list[ExtractedFact] = Field(default_factory=list)


class EntityDecision(BaseModel):
    """Whether a new name is an existing entity."""

    new: int = Field(description="Number of the NEW ENTITY (N1 -> 1).")
    same_as: int | None = Field(
        default=None, description="Number of the existing entity it is (E3 -> 3), or null if it is none of them."
    )


class FactDecision(BaseModel):
    """How a new fact relates to the existing facts listed with it.

    ``duplicates`` lists every existing fact that states the same thing: two listed statements may both be the new
    fact's, and naming one only would leave the other judged "compatible", which is never asked again. An answer in
    the earlier form, one ``duplicate_of`` number (or null), is read as a list of that one."""

    new: int = Field(description="Number of the NEW FACT (F1 -> 1).")
    duplicates: list[int] = Field(
        default_factory=list, description="Existing facts (X numbers) that state the same thing as the new fact."
    )
    contradicts: list[int] = Field(
        default_factory=list,
        description="Existing facts (X numbers) that cannot be true at the same time as the new fact.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_duplicate(cls, data: Any) -> Any:
        """The earlier form: ``duplicate_of`` (a number or null) instead of ``duplicates``."""
        if isinstance(data, dict) and "duplicate_of" in data:
            data = dict(data)
            one = data.pop("duplicate_of")
            if "duplicates" in data:
                raise ValueError("give duplicates or duplicate_of, not both")
            data["duplicates"] = [] if one is None else [one]
        return data


class Resolution(BaseModel):
    """The batched resolution of one episode: entity identities, fact duplicates and contradictions."""

    reasoning: str = Field(default="", description="Brief reasoning, written before the decisions.")
    entities: list[EntityDecision] = Field(default_factory=list)
    facts: list[FactDecision] = Field(default_factory=list)
