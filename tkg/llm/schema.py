"""Typed response models of the extraction prompts (instructor validates the LLM's output against these)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ExtractedEntity(BaseModel):
    """An entity named in the current episode."""

    name: str = Field(description="The entity's name as written, most complete form (e.g. 'Alice Smith').")
    label: str = Field(
        default="Entity", description="A short type such as Person, Organization, Place, Event, Object, Concept."
    )
    summary: str = Field(default="", description="One sentence on what the episode says about this entity.")


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


class GraphExtraction(BaseModel):
    """Entities and facts of one episode."""

    entities: list[ExtractedEntity] = Field(default_factory=list)
    facts: list[ExtractedFact] = Field(default_factory=list)
