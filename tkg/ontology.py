"""User-declared entity and relation types: what extraction looks for, which attributes it fills, and which
relations are single-valued (a new value ends the old one without asking an LLM).

>>> from pydantic import BaseModel, Field
>>> class Person(BaseModel):
...     '''A human being.'''
...     occupation: str | None = Field(None, description="What the person does for a living")
>>> onto = Ontology(entities={"Person": Person}, relations={"LIVES_IN": RelationType(single_valued=True)})
>>> onto.single_valued("LIVES_IN"), onto.single_valued("LIKES")
(True, False)
>>> onto.entity_attributes("Person", {"occupation": "nurse", "shoe": 9})
({'occupation': 'nurse'}, ['Person: attribute shoe is not declared; dropped'])
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import to_jsonable_python

from tkg.errors import ConfigurationError
from tkg.invalidation import overlaps
from tkg.models import Fact, check_relation

_LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_RESERVED = frozenset({"id", "name", "group_id", "summary", "labels", "created_at", "aliases", "uuid"})


@dataclass(frozen=True, slots=True)
class RelationType:
    """A relation type. ``single_valued``: a subject has at most one object at a time (LIVES_IN, WORKS_AT,
    MARRIED_TO ...). ``sources`` / ``targets``: entity labels allowed at each end (empty: any). ``model``: a
    pydantic model of the relation's attributes, if it has any."""

    description: str = ""
    single_valued: bool = False
    sources: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    model: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):
            raise ConfigurationError(f"RelationType.description must be a string, not {self.description!r}")
        if not isinstance(self.single_valued, bool):
            raise ConfigurationError(f"RelationType.single_valued must be True or False, not {self.single_valued!r}")
        for part in ("sources", "targets"):
            labels = getattr(self, part)
            if not isinstance(labels, tuple | list) or not all(isinstance(label, str) for label in labels):
                raise ConfigurationError(
                    f"RelationType.{part} must be a tuple of entity type names (e.g. ('Person',)), not {labels!r}"
                )
            object.__setattr__(self, part, tuple(labels))


@dataclass(frozen=True, slots=True)
class Ontology:
    """Entity types (label -> pydantic model whose docstring describes the type and whose fields are the attributes
    to extract) and relation types (SCREAMING_SNAKE name -> :class:`RelationType`)."""

    entities: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    relations: Mapping[str, RelationType] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for part in ("entities", "relations"):
            if not isinstance(getattr(self, part), Mapping):
                raise ConfigurationError(f"Ontology.{part} must be a mapping, not {getattr(self, part)!r}")
        for label, model in self.entities.items():
            if not isinstance(label, str) or not _LABEL_RE.match(label) or label == "Entity":
                raise ConfigurationError(f"entity type name {label!r} must be an identifier other than 'Entity'")
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise ConfigurationError(f"entity type {label!r} must be a pydantic model class")
            clash = sorted(set(model.model_fields) & _RESERVED)
            if clash:
                raise ConfigurationError(f"entity type {label!r} uses reserved attribute names {clash}")
        for name, relation in self.relations.items():
            try:
                check_relation(name)
            except Exception as exc:
                raise ConfigurationError(str(exc)) from None
            if not isinstance(relation, RelationType):
                raise ConfigurationError(f"relation {name!r} must be declared with RelationType(...)")
            if relation.model is not None and not (
                isinstance(relation.model, type) and issubclass(relation.model, BaseModel)
            ):
                raise ConfigurationError(f"relation {name!r}: model must be a pydantic model class")
            for label in (*relation.sources, *relation.targets):
                if label != "Entity" and label not in self.entities:
                    raise ConfigurationError(f"relation {name!r} names entity type {label!r}, which is not declared")
        object.__setattr__(self, "entities", MappingProxyType(dict(self.entities)))
        object.__setattr__(self, "relations", MappingProxyType(dict(self.relations)))

    def __bool__(self) -> bool:
        return bool(self.entities or self.relations)

    def single_valued(self, relation: str) -> bool:
        declared = self.relations.get(relation)
        return declared is not None and declared.single_valued

    def entity_attributes(self, label: str, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Keep the attributes the entity type declares, validated by its model; returns (kept, warnings)."""
        return _validate(f"{label}", self.entities.get(label), values)

    def relation_attributes(self, relation: str, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        declared = self.relations.get(relation)
        return _validate(relation, declared.model if declared else None, values)

    def describe(self) -> str:
        """The types as prompt text: one line per type, with its attributes and their descriptions."""
        lines = []
        for label, model in self.entities.items():
            doc = " ".join((model.__doc__ or "").split())
            attrs = "; ".join(f"{n}: {f.description or f.annotation}" for n, f in model.model_fields.items())
            lines.append(f"- entity {label}: {doc}" + (f" Attributes: {attrs}" if attrs else ""))
        for name, rel in self.relations.items():
            ends = ""
            if rel.sources or rel.targets:
                ends = f" ({'/'.join(rel.sources) or 'any'} -> {'/'.join(rel.targets) or 'any'})"
            attrs = ""
            if rel.model is not None:
                attrs = " Attributes: " + "; ".join(
                    f"{n}: {f.description or f.annotation}" for n, f in rel.model.model_fields.items()
                )
            one = " One value at a time per subject." if rel.single_valued else ""
            lines.append(f"- relation {name}{ends}: {rel.description}{one}{attrs}")
        return "\n".join(lines)

    def conflicts(self, facts: Iterable[Fact]) -> list[str]:
        """Where existing facts break a single-valued declaration: a subject with two live objects at once."""
        open_by_subject: dict[tuple[str, str, str], list[Fact]] = {}
        for fact in facts:
            if fact.expired_at is None and self.single_valued(fact.relation):
                open_by_subject.setdefault((fact.group_id, fact.source_id, fact.relation), []).append(fact)
        problems = []
        for (group, source, relation), facts_ in open_by_subject.items():
            for i, a in enumerate(facts_):
                for b in facts_[i + 1 :]:
                    if a.target_id != b.target_id and overlaps(a, b):
                        problems.append(
                            f"group {group}: entity {source} has two {relation} facts at once: "
                            f"{a.fact!r} and {b.fact!r}"
                        )
        return problems


def _validate(owner: str, model: type[BaseModel] | None, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if not values:
        return {}, []
    if model is None:
        return {}, [f"{owner}: no attributes are declared; dropped {sorted(values)}"]
    warnings = [f"{owner}: attribute {k} is not declared; dropped" for k in values if k not in model.model_fields]
    known = {k: v for k, v in values.items() if k in model.model_fields and v is not None}
    try:  # all together first: the model's own validators see every attribute given
        whole = model.model_validate(known)
    except Exception:
        pass
    else:
        return {key: _plain(getattr(whole, key)) for key in known}, warnings
    kept: dict[str, Any] = {}
    for key, value in known.items():  # one at a time: the valid ones are kept
        try:
            checked = model.__pydantic_validator__.validate_assignment(model.model_construct(), key, value)
        except PydanticValidationError as exc:
            warnings.append(f"{owner}: attribute {key}={value!r} is invalid ({exc.errors()[0]['msg']}); dropped")
            continue
        except Exception as exc:
            warnings.append(f"{owner}: attribute {key}={value!r} cannot be checked without the others ({exc}); dropped")
            continue
        kept[key] = _plain(getattr(checked, key))
    return kept, warnings


def _plain(value: Any) -> Any:
    """The JSON form of a validated attribute value, as pydantic writes it: an enum its value, a model its fields,
    a set a list, a date its ISO text (a float that is not a number stays one)."""
    return to_jsonable_python(value, inf_nan_mode="constants", fallback=str)
