"""Held-out JSON schemas of common real-world shapes, each with the request a user would send.

Free-text strings have no ``maxLength`` and arrays no ``maxItems`` (as people write them), so a
small model that repeats under the grammar would run to the budget: these are what the
repetition guard and the budget-aware closing are measured on (``test_schema_battery.py``,
``benchmarks/grammar.py --battery``). The calendar event is vLLM's own structured-output test.
"""

from __future__ import annotations

from typing import Any

S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}


def obj(properties: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A strict object (every property required, no extras) unless ``optional`` names some."""
    return {
        "type": "object",
        "properties": properties,
        "required": [k for k in properties if k not in optional],
        "additionalProperties": False,
    }


def arr(items: dict[str, Any], **bounds: int) -> dict[str, Any]:
    return {"type": "array", "items": items, **bounds}


def enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


BATTERY: list[tuple[str, str, dict[str, Any]]] = [
    (
        "calendar_event",
        "Extract the event information: Alice and Bob are going to a science fair on Friday.",
        obj({"name": S, "date": S, "participants": arr(S)}),
    ),
    (
        "recipe",
        "Give me a simple pancake recipe as JSON.",
        obj({"name": S, "ingredients": arr(obj({"item": S, "amount": S})), "steps": arr(S)}),
    ),
    (
        "person",
        "Describe a fictional software engineer who speaks several languages.",
        obj({"name": S, "age": I, "languages": arr(S)}),
    ),
    (
        "ticket",
        "File a support ticket: the login page shows a blank screen on Safari since Monday.",
        obj({"title": S, "priority": enum("low", "medium", "high"), "tags": arr(S)}),
    ),
    (
        "steps",
        "List the steps to change a flat tyre.",
        obj({"steps": arr(S)}),
    ),
    (
        "order",
        "Create an order for two notebooks and a pen.",
        obj({"order": obj({"id": S, "items": arr(obj({"sku": S, "quantity": I}))})}),
    ),
    (
        "movie_review",
        "Review the movie Inception.",
        obj(
            {
                "title": S,
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "pros": arr(S),
                "cons": arr(S),
            }
        ),
    ),
    (
        "address",
        "Parse this address: 221B Baker Street, London NW1 6XE, United Kingdom.",
        obj({"street": S, "city": S, "postcode": S, "country": S}),
    ),
    (
        "product",
        "Describe a product listing for a stainless steel water bottle.",
        obj(
            {
                "name": S,
                "price": N,
                "in_stock": B,
                "categories": arr(enum("kitchen", "sports", "outdoor", "office")),
            }
        ),
    ),
    (
        "contact_nullable",
        "Extract the contact: Maria Lopez, maria@example.com, no phone given.",
        obj(
            {
                "name": S,
                "email": {"type": ["string", "null"]},
                "phone": {"anyOf": [S, {"type": "null"}]},
            }
        ),
    ),
    (
        "contact_method_anyof",
        "How should we contact Tom? He prefers email at tom@example.org.",
        obj(
            {
                "method": {
                    "anyOf": [
                        obj({"kind": {"const": "email"}, "address": S}),
                        obj({"kind": {"const": "phone"}, "number": S}),
                    ]
                }
            }
        ),
    ),
    (
        "company_four_deep",
        "Describe a small company with one department, one team and its lead.",
        obj(
            {
                "company": obj(
                    {
                        "name": S,
                        "department": obj(
                            {
                                "name": S,
                                "team": obj({"name": S, "lead": obj({"name": S, "role": S})}),
                            }
                        ),
                    }
                )
            }
        ),
    ),
    (
        "sentiment",
        "Classify the sentiment: I absolutely loved the service, will come again!",
        obj({"sentiment": enum("positive", "neutral", "negative"), "confidence": N}),
    ),
    (
        "entities",
        "Extract the named entities: Barack Obama visited Paris with Michelle in 2015.",
        obj({"entities": arr(obj({"text": S, "label": enum("PERSON", "PLACE", "DATE", "ORG")}))}),
    ),
    (
        "translation",
        "Translate 'Good morning, how are you?' into French.",
        obj({"source_language": S, "target_language": S, "translation": S}),
    ),
    (
        "math",
        "What is 17 times 3? Explain briefly.",
        obj({"reasoning": S, "answer": N}),
    ),
    (
        "books",
        "List three classic novels with their authors and years.",
        obj({"books": arr(obj({"title": S, "author": S, "year": I}))}),
    ),
    (
        "weather",
        "Give a weather report for Madrid with a three-day forecast.",
        obj(
            {
                "city": S,
                "temperature": N,
                "conditions": enum("sunny", "cloudy", "rainy", "snowy"),
                "forecast": arr(obj({"day": S, "high": N, "low": N})),
            }
        ),
    ),
    (
        "meeting",
        "Summarise the meeting: Ana will send the budget by Friday; Li fixes the build.",
        obj({"summary": S, "action_items": arr(obj({"owner": S, "task": S}))}),
    ),
    (
        "quiz",
        "Write a multiple-choice question about the solar system.",
        obj({"question": S, "options": arr(S), "answer_index": I}),
    ),
    (
        "profile",
        "Create a user profile for a hiker who likes photography.",
        obj(
            {
                "username": S,
                "bio": S,
                "interests": arr(S),
                "settings": obj({"theme": enum("light", "dark"), "notifications": B}),
            }
        ),
    ),
    (
        "flight",
        "Book a flight from Berlin to Rome on 2026-05-04 for two adults in economy.",
        obj(
            {
                "origin": S,
                "destination": S,
                "date": S,
                "passengers": I,
                "cabin": enum("economy", "business", "first"),
            }
        ),
    ),
    (
        "optional_fields",
        "Describe a used car for sale.",
        obj(
            {"make": S, "model": S, "year": I, "mileage_km": I, "notes": S},
            optional=("notes", "mileage_km"),
        ),
    ),
    (
        "tags",
        "Suggest tags for a blog post about saving money on groceries.",
        obj({"title": S, "tags": arr(S)}),
    ),
]
