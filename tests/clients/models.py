"""The pydantic models the client tests ask for: an enum and a nested model, so every schema has ``$defs``."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Unit(StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str = Field(max_length=20)


class WeatherQuery(BaseModel):
    """Ask for the weather in a place."""

    place: Place
    unit: Unit


class Person(BaseModel):
    # Closed (additionalProperties: false): guidance samples at the server's default temperature, and
    # an open object lets a sampled answer run past its max_tokens.
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


PROMPT = "Ann is 31 years old. Describe her."
WEATHER_PROMPT = "What is the weather in Paris, in celsius?"
JSON_PROMPT = "Describe a cat as a JSON object with its name and age."
