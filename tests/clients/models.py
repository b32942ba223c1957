"""The pydantic models the client tests ask for: an enum and a nested model, so every schema has ``$defs``."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


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
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


PROMPT = "Ann is 31 years old. Describe her."
WEATHER_PROMPT = "What is the weather in Paris, in celsius?"
JSON_PROMPT = "Describe a cat as a JSON object with its name and age."
